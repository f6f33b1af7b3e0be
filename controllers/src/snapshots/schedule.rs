//! When snapshots are taken: 5-field cron (as crontab writes it), 6-field cron with seconds, `@every <duration>`,
//! or the macros `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};

/// A parsed snapshot schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    Cron {
        source: String,
        schedule: Box<cron::Schedule>,
    },
    Every(Duration),
}

/// A schedule that does not parse, with the text and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("snapshot schedule {text:?}: {reason}")]
pub struct ScheduleError {
    pub text: String,
    pub reason: String,
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Schedule::Cron { source: a, .. }, Schedule::Cron { source: b, .. }) => a == b,
            (Schedule::Every(a), Schedule::Every(b)) => a == b,
            _ => false,
        }
    }
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Self, ScheduleError> {
        let err = |reason: String| ScheduleError {
            text: text.to_string(),
            reason,
        };
        let t = text.trim();
        if let Some(d) = t.strip_prefix("@every") {
            let d = hostlet_api::objects::parse_duration(d).map_err(err)?;
            if d < Duration::from_secs(1) {
                return Err(err("@every needs at least 1s".into()));
            }
            return Ok(Schedule::Every(d));
        }
        let expr = if t.starts_with('@') {
            t.to_string()
        } else {
            let fields: Vec<&str> = t.split_whitespace().collect();
            match fields.len() {
                5 => format!("0 {} {}", fields[..4].join(" "), crontab_weekdays(fields[4]).map_err(err)?),
                6 => format!("{} {}", fields[..5].join(" "), crontab_weekdays(fields[5]).map_err(err)?),
                n => {
                    return Err(err(format!(
                        "expected 5 cron fields (minute hour day month weekday), 6 with seconds first, or @every <duration>; found {n}"
                    )))
                }
            }
        };
        let schedule = cron::Schedule::from_str(&expr).map_err(|e| err(e.to_string()))?;
        if schedule.upcoming(Utc).next().is_none() {
            return Err(err("never fires".into()));
        }
        Ok(Schedule::Cron {
            source: t.to_string(),
            schedule: Box::new(schedule),
        })
    }

    /// The first firing strictly after `after` (for `@every`, one period after it).
    pub fn next_after(&self, after: SystemTime) -> Option<SystemTime> {
        match self {
            Schedule::Every(d) => Some(after + *d),
            Schedule::Cron { schedule, .. } => {
                let at: DateTime<Utc> = after.into();
                schedule.after(&at).next().map(SystemTime::from)
            }
        }
    }
}

/// crontab numbers weekdays 0–7 with Sunday as 0 and 7; the cron parser numbers them 1–7 from Sunday.
/// Names (`MON-FRI`) pass through.
fn crontab_weekdays(field: &str) -> Result<String, String> {
    let map = |n: &str| -> Result<String, String> {
        match n.parse::<u8>() {
            Ok(v @ 0..=6) => Ok((v + 1).to_string()),
            Ok(7) => Ok("1".to_string()),
            Ok(v) => Err(format!("weekday {v} is out of range 0-7")),
            Err(_) => Ok(n.to_string()),
        }
    };
    field
        .split(',')
        .map(|part| {
            let (base, step) = match part.split_once('/') {
                Some((b, s)) => (b, Some(s)),
                None => (part, None),
            };
            let base = match base.split_once('-') {
                Some((a, b)) => format!("{}-{}", map(a)?, map(b)?),
                None if base == "*" || base == "?" => base.to_string(),
                None => map(base)?,
            };
            Ok(match step {
                Some(s) => format!("{base}/{s}"),
                None => base,
            })
        })
        .collect::<Result<Vec<_>, String>>()
        .map(|parts| parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, TimeZone, Timelike};

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> SystemTime {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap().into()
    }

    fn next(s: &str, after: SystemTime) -> DateTime<Utc> {
        Schedule::parse(s)
            .unwrap()
            .next_after(after)
            .unwrap()
            .into()
    }

    #[test]
    fn default_schedule_fires_every_twelve_hours_on_the_hour() {
        let n = next("0 */12 * * *", at(2026, 11, 30, 2, 25, 6));
        assert_eq!((n.hour(), n.minute(), n.second()), (12, 0, 0));
        let n = next("0 */12 * * *", at(2026, 11, 30, 12, 0, 0));
        assert_eq!((n.day(), n.hour()), (1, 0));
    }

    #[test]
    fn six_fields_have_seconds_first() {
        let n = next("*/10 * * * * *", at(2026, 1, 1, 0, 0, 1));
        assert_eq!(n.second(), 10);
    }

    #[test]
    fn every_is_relative_to_the_last_run() {
        let base = at(2026, 1, 1, 0, 0, 0);
        let s = Schedule::parse("@every 2s").unwrap();
        assert_eq!(s.next_after(base), Some(base + Duration::from_secs(2)));
        assert!(Schedule::parse("@every 0s").is_err());
    }

    #[test]
    fn crontab_weekday_numbers_mean_what_crontab_means() {
        // 2026-11-30 is a Monday.
        let n = next("0 0 * * 1", at(2026, 11, 29, 12, 0, 0));
        assert_eq!(n.weekday(), chrono::Weekday::Mon);
        let n = next("0 0 * * 0", at(2026, 11, 30, 12, 0, 0));
        assert_eq!(n.weekday(), chrono::Weekday::Sun);
        let n = next("0 0 * * 7", at(2026, 11, 30, 12, 0, 0));
        assert_eq!(n.weekday(), chrono::Weekday::Sun);
        let n = next("0 0 * * 1-5", at(2026, 12, 4, 12, 0, 0)); // Friday noon → Monday
        assert_eq!(n.weekday(), chrono::Weekday::Mon);
        let n = next("0 0 * * SAT", at(2026, 11, 30, 12, 0, 0));
        assert_eq!(n.weekday(), chrono::Weekday::Sat);
    }

    #[test]
    fn macros_and_bad_schedules() {
        assert_eq!(next("@hourly", at(2026, 1, 1, 0, 30, 0)).hour(), 1);
        for bad in [
            "",
            "* * *",
            "61 * * * *",
            "0 0 * * 9",
            "@every soon",
            "@fortnightly",
        ] {
            let e = Schedule::parse(bad).unwrap_err();
            assert_eq!(e.text, bad);
        }
    }
}

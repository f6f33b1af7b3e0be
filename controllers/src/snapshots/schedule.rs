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
            check_ranges(&fields).map_err(err)?;
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

/// Each number of each field within its range, named as crontab(5) names the fields (the parser's own
/// messages are off by one and name no value).
fn check_ranges(fields: &[&str]) -> Result<(), String> {
    const FIVE: [(&str, u32, u32); 5] = [
        ("minute", 0, 59),
        ("hour", 0, 23),
        ("day of month", 1, 31),
        ("month", 1, 12),
        ("day of week", 0, 7),
    ];
    let named: Vec<(&str, u32, u32)> = match fields.len() {
        5 => FIVE.to_vec(),
        6 => std::iter::once(("second", 0, 59)).chain(FIVE).collect(),
        _ => return Ok(()),
    };
    for (field, (name, lo, hi)) in fields.iter().zip(named) {
        for part in field.split(',') {
            let (base, step) = match part.split_once('/') {
                Some((b, s)) => (b, Some(s)),
                None => (part, None),
            };
            if let Some(step) = step {
                match step.parse::<u32>() {
                    Ok(n) if n >= 1 => {}
                    _ => {
                        return Err(format!(
                        "{name} field {field:?}: step {step:?} must be a whole number of 1 or more"
                    ))
                    }
                }
            }
            for v in base.split('-') {
                if let Ok(n) = v.parse::<u32>() {
                    if n < lo || n > hi {
                        return Err(format!(
                            "{name} {n} is out of range {lo}-{hi} (in {field:?})"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
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

    #[test]
    fn out_of_range_numbers_name_the_field_and_its_range() {
        let e = Schedule::parse("61 * * * *").unwrap_err().to_string();
        assert!(e.contains("minute 61 is out of range 0-59"), "{e}");
        let e = Schedule::parse("0 24 * * *").unwrap_err().to_string();
        assert!(e.contains("hour 24 is out of range 0-23"), "{e}");
        let e = Schedule::parse("0 0 0 * *").unwrap_err().to_string();
        assert!(e.contains("day of month 0 is out of range 1-31"), "{e}");
        let e = Schedule::parse("60 0 0 * * *").unwrap_err().to_string();
        assert!(e.contains("second 60"), "{e}");
        let e = Schedule::parse("*/0 * * * *").unwrap_err().to_string();
        assert!(e.contains("step"), "{e}");
        assert!(Schedule::parse("59 23 31 12 7").is_ok());
        assert!(Schedule::parse("0-59/5 * * JAN-DEC MON-FRI").is_ok());
    }

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

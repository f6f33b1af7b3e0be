//! Progress of long byte transfers (snapshot save, check, restore) on stderr: a bar with bytes, rate and ETA
//! on a terminal; otherwise plain lines (one per tenth of the total or every few seconds, never `\r`) that
//! read well in a log or a CI transcript.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::cluster::human_bytes;

/// How often a plain line is written at the latest while bytes move.
const PLAIN_EVERY: Duration = Duration::from_secs(3);

pub struct Progress {
    verb: &'static str,
    total: Option<u64>,
    /// The total is an estimate (plain lines say `~`).
    estimated: bool,
    started: Instant,
    kind: Kind,
}

enum Kind {
    Bar(ProgressBar),
    Plain {
        last_line: Instant,
        last_tenth: u64,
        last_bytes: u64,
    },
}

impl Progress {
    /// `verb` names what the bytes are ("received", "checked"); `total` is the size, if known.
    pub fn new(verb: &'static str, total: Option<u64>) -> Progress {
        Progress::with_terminal(verb, total, std::io::stderr().is_terminal())
    }

    /// [`Progress::new`] with a total that is only an estimate.
    pub fn estimated(verb: &'static str, total: Option<u64>) -> Progress {
        Progress {
            estimated: true,
            ..Progress::new(verb, total)
        }
    }

    fn with_terminal(verb: &'static str, total: Option<u64>, terminal: bool) -> Progress {
        let now = Instant::now();
        let kind = if terminal {
            let bar = match total {
                Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr())
                    .with_style(
                        ProgressStyle::with_template(
                            "  {msg} {bytes}/{total_bytes} [{wide_bar}] {binary_bytes_per_sec}, ETA {eta}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                    ),
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
                    .with_style(
                        ProgressStyle::with_template(
                            "  {spinner} {msg} {bytes} {binary_bytes_per_sec}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    ),
            };
            bar.set_message(verb);
            Kind::Bar(bar)
        } else {
            Kind::Plain {
                last_line: now,
                last_tenth: 0,
                last_bytes: 0,
            }
        };
        Progress {
            verb,
            total,
            estimated: false,
            started: now,
            kind,
        }
    }

    /// `bytes` done so far.
    pub fn update(&mut self, bytes: u64) {
        let verb = self.verb;
        match &mut self.kind {
            Kind::Bar(bar) => {
                // The total is an estimate for saves (the db size); never let the bar run past its end.
                if bar.length().is_some_and(|l| bytes > l) {
                    bar.set_length(bytes);
                }
                bar.set_position(bytes);
            }
            Kind::Plain {
                last_line,
                last_tenth,
                last_bytes,
            } => {
                if bytes == *last_bytes {
                    return;
                }
                let tenth = self
                    .total
                    .filter(|t| *t > 0)
                    .map(|t| (bytes.min(t) * 10 / t).min(10))
                    .unwrap_or(0);
                if tenth > *last_tenth || last_line.elapsed() >= PLAIN_EVERY {
                    let about = if self.estimated { "~" } else { "" };
                    let of = match self.total {
                        Some(t) if t > 0 => {
                            format!(
                                " of {about}{} ({}%)",
                                human_bytes(t),
                                bytes.min(t) * 100 / t
                            )
                        }
                        _ => String::new(),
                    };
                    eprintln!("  {verb} {}{of}", human_bytes(bytes));
                    *last_line = Instant::now();
                    *last_tenth = tenth;
                    *last_bytes = bytes;
                }
            }
        }
    }

    /// Ends the progress with a line naming the bytes, the time taken and the mean rate.
    pub fn finish(self, bytes: u64) {
        let took = self.started.elapsed();
        if let Kind::Bar(bar) = &self.kind {
            bar.finish_and_clear();
        }
        let rate = bytes as f64 / took.as_secs_f64().max(0.001);
        eprintln!(
            "  done: {} {} in {:.1}s ({}/s)",
            self.verb,
            human_bytes(bytes),
            took.as_secs_f64(),
            human_bytes(rate as u64)
        );
    }

    /// Ends the progress without a done line (the operation failed; its error follows).
    pub fn abandon(self) {
        if let Kind::Bar(bar) = &self.kind {
            bar.abandon();
        }
    }
}

//! The exit codes of every `hostlet` command, one per kind of failure, so scripts can tell them apart.
//! docs/reference.md lists them; a test compares the two.

use std::process::ExitCode;

use hostlet_runtime::EtcdError;

/// Why a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Success = 0,
    /// Any failure not listed below (an I/O error, a local file that cannot be written, …).
    Failed = 1,
    /// The command line itself is wrong (clap's usage errors).
    Usage = 2,
    /// The thing named does not exist: a pod, a node, a snapshot file, a manifest file.
    NotFound = 3,
    /// Refused: a manifest or request did not pass validation, or the agent refused the request.
    Refused = 4,
    /// etcd (or the agent through it) cannot be reached.
    Unreachable = 5,
}

impl Exit {
    /// Every code, in order.
    pub const ALL: [Exit; 6] = [
        Exit::Success,
        Exit::Failed,
        Exit::Usage,
        Exit::NotFound,
        Exit::Refused,
        Exit::Unreachable,
    ];
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

/// A command's failure: the message printed and the exit code it ends with.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

impl CliError {
    pub fn not_found(message: impl Into<String>) -> CliError {
        CliError {
            exit: Exit::NotFound,
            message: message.into(),
        }
    }

    pub fn refused(message: impl Into<String>) -> CliError {
        CliError {
            exit: Exit::Refused,
            message: message.into(),
        }
    }

    pub fn unreachable(message: impl Into<String>) -> CliError {
        CliError {
            exit: Exit::Unreachable,
            message: message.into(),
        }
    }

    /// Prints the message and gives the exit code.
    pub fn report(self) -> ExitCode {
        eprintln!("hostlet: {}", self.message);
        self.exit.into()
    }

    /// The same failure with `context: ` before its message.
    pub fn context(self, context: impl std::fmt::Display) -> CliError {
        CliError {
            exit: self.exit,
            message: format!("{context}: {}", self.message),
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for CliError {
    fn from(message: String) -> CliError {
        CliError {
            exit: Exit::Failed,
            message,
        }
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> CliError {
        message.to_string().into()
    }
}

impl From<EtcdError> for CliError {
    fn from(e: EtcdError) -> CliError {
        let exit = if e.is_unavailable() {
            Exit::Unreachable
        } else {
            Exit::Failed
        };
        CliError {
            exit,
            message: e.to_string(),
        }
    }
}

/// A local file's read error: missing is "not found", anything else a plain failure.
pub fn io_error(shown: impl std::fmt::Display, e: &std::io::Error) -> CliError {
    let message = format!("{shown}: {e}");
    if e.kind() == std::io::ErrorKind::NotFound {
        CliError::not_found(message)
    } else {
        message.into()
    }
}

#[cfg(test)]
mod tests {
    use super::Exit;

    #[test]
    fn all_holds_every_code_in_order() {
        for (i, e) in Exit::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i, "{e:?}");
            // No wildcard: a new code fails to compile here until it is added to ALL.
            match e {
                Exit::Success
                | Exit::Failed
                | Exit::Usage
                | Exit::NotFound
                | Exit::Refused
                | Exit::Unreachable => {}
            }
        }
    }
}

//! Path flags are made absolute against the current directory when parsed, so a relative path means the
//! same wherever it is used later (the agent hands paths to etcd, Docker and its own children).

use std::path::PathBuf;

/// A path flag's value, absolute against the current directory (not resolved: it need not exist yet).
pub fn absolute(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    std::path::absolute(s).map_err(|e| format!("cannot make {s:?} absolute: {e}"))
}

/// A snapshot location: an `s3://bucket/key` URL kept as it is, else a path made absolute.
pub fn absolute_or_s3(s: &str) -> Result<PathBuf, String> {
    if s.starts_with("s3://") {
        Ok(PathBuf::from(s))
    } else {
        absolute(s)
    }
}

/// A program flag: a bare name is looked up on `PATH` when run; a path (it has a `/`) is made absolute.
pub fn program(s: &str) -> Result<PathBuf, String> {
    if s.contains('/') {
        absolute(s)
    } else if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(PathBuf::from(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_made_absolute_and_bare_programs_kept() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(absolute("data").unwrap(), cwd.join("data"));
        assert_eq!(absolute("/var/lib/x").unwrap(), PathBuf::from("/var/lib/x"));
        assert_eq!(program("etcd").unwrap(), PathBuf::from("etcd"));
        assert_eq!(program("./bin/etcd").unwrap(), cwd.join("bin/etcd"));
        assert!(absolute("").is_err());
    }
}

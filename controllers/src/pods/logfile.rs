//! A container's json-file log read from the engine's files and followed across rotations.
//!
//! The engine's own follower reopens the live file when it hears of a rotation, so a reader that is a whole
//! file behind skips that file. Read here, a followed log finishes the file it has open (renamed or not),
//! then moves to the file written after it, found by inode among the rotated names (`<log>.1`, `<log>.2`,
//! …). A slow reader loses lines only once the caps have deleted a file it had not reached.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// One line of a json-file log as the engine writes it.
#[derive(serde::Deserialize)]
struct Entry<'a> {
    #[serde(borrow)]
    log: Cow<'a, str>,
    #[serde(default, borrow)]
    time: Cow<'a, str>,
}

/// What one read gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Entries as the reader wants them (possibly none, when only part of a line came).
    Data(Vec<u8>),
    /// At the end of the live file: nothing more until the engine writes.
    Idle,
}

/// The file being read.
struct Open {
    file: File,
    ino: u64,
    offset: u64,
    /// The live name no longer points at this file: once it is read to the end, the next one follows.
    rotated: bool,
}

/// Reads a json-file log from its oldest kept file on (or its last `tail` lines), then follows it.
pub struct Follower {
    live: PathBuf,
    timestamps: bool,
    since: Option<SystemTime>,
    /// Where to start, until the first read: the last this many lines.
    tail: Option<usize>,
    open: Option<Open>,
    carry: Vec<u8>,
    /// Times the file after the one read had already been deleted (the reader fell behind the caps).
    pub lost: u64,
    /// Lines that were not json-file entries (skipped).
    pub unreadable: u64,
}

fn ino_of(path: &Path) -> io::Result<Option<u64>> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(m.ino())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl Follower {
    /// A follower of the log whose live file is `live`; `since` and `tail` as `docker logs` reads them.
    pub fn new(
        live: PathBuf,
        timestamps: bool,
        since: Option<SystemTime>,
        tail: Option<usize>,
    ) -> Self {
        Follower {
            live,
            timestamps,
            since,
            tail,
            open: None,
            carry: Vec::new(),
            lost: 0,
            unreadable: 0,
        }
    }

    /// `<log>.<index>`; index 0 is the live file.
    fn name(&self, index: u32) -> PathBuf {
        if index == 0 {
            return self.live.clone();
        }
        let mut s = self.live.clone().into_os_string();
        s.push(format!(".{index}"));
        PathBuf::from(s)
    }

    /// The highest index of a rotated file in the directory now.
    fn highest_index(&self) -> io::Result<u32> {
        let (Some(dir), Some(base)) = (self.live.parent(), self.live.file_name()) else {
            return Ok(0);
        };
        let prefix = format!("{}.", base.to_string_lossy());
        let mut highest = 0;
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(n) = name
                .strip_prefix(&prefix)
                .and_then(|s| s.parse::<u32>().ok())
            {
                highest = highest.max(n);
            }
        }
        Ok(highest)
    }

    /// Where the file `ino` is now among the names. Names are looked at upwards, the way rotation moves a
    /// file, so a file renamed during the look is still found; `None` when it has been deleted.
    fn index_of(&self, ino: u64) -> io::Result<Option<u32>> {
        // A listing is not atomic under renames: it only bounds the look, with room for rotations meanwhile.
        let bound = self.highest_index()?.saturating_add(2);
        for index in 0..=bound {
            if ino_of(&self.name(index))? == Some(ino) {
                return Ok(Some(index));
            }
        }
        Ok(None)
    }

    /// Reads `file` (inode `ino`) from `offset` on; a line cut off at the end of the file left (the engine
    /// stopped mid-write) is not joined to the next one.
    fn switch_to(&mut self, file: File, ino: u64, offset: u64) {
        self.open = Some(Open {
            file,
            ino,
            offset,
            rotated: false,
        });
        self.carry.clear();
    }

    /// Opens the oldest file kept; false when there is none yet.
    fn open_oldest(&mut self) -> io::Result<bool> {
        let highest = self.highest_index()?;
        for index in (0..=highest).rev() {
            match File::open(self.name(index)) {
                Ok(file) => {
                    let ino = file.metadata()?.ino();
                    self.switch_to(file, ino, 0);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// Moves from the file read to its end to the one written after it; false when that cannot be told yet
    /// (a rotation under way).
    fn open_next(&mut self) -> io::Result<bool> {
        let Some(ours) = self.open.as_ref().map(|o| o.ino) else {
            return self.open_oldest();
        };
        let Some(k) = self.index_of(ours)? else {
            // Deleted by the caps before it was read through: what came right after may be gone too.
            self.lost += 1;
            return self.open_oldest();
        };
        if k == 0 {
            // Live again (the name was missing for a moment): nothing to move to.
            if let Some(o) = self.open.as_mut() {
                o.rotated = false;
            }
            return Ok(false);
        }
        let next = self.name(k - 1);
        let file = match File::open(&next) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let ino = file.metadata()?.ino();
        // Nothing moved between the look and the open: the file opened is the one right after ours.
        if ino_of(&self.name(k))? != Some(ours) || ino_of(&next)? != Some(ino) {
            return Ok(false);
        }
        self.switch_to(file, ino, 0);
        Ok(true)
    }

    /// Opens the file holding the start of the last `n` lines, there (the files read from the end back).
    fn open_tail(&mut self, n: usize) -> io::Result<bool> {
        use std::io::{Seek, SeekFrom};
        const BLOCK: u64 = 64 * 1024;
        let highest = self.highest_index()?;
        let mut need = n;
        let mut start = None;
        for index in 0..=highest {
            let mut file = match File::open(self.name(index)) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let meta = file.metadata()?;
            let (ino, len) = (meta.ino(), meta.len());
            // The last n lines start just after the (n+1)th newline from the end; a partial last line
            // (no newline yet) is not one of them.
            let mut end = len;
            let mut found = None;
            let mut seen = 0usize;
            let mut buf = vec![0u8; BLOCK as usize];
            while end > 0 && found.is_none() {
                let from = end.saturating_sub(BLOCK);
                let size = (end - from) as usize;
                file.seek(SeekFrom::Start(from))?;
                file.read_exact(&mut buf[..size])?;
                for (i, b) in buf[..size].iter().enumerate().rev() {
                    if *b == b'\n' {
                        if seen == need {
                            found = Some(from + i as u64 + 1);
                            break;
                        }
                        seen += 1;
                    }
                }
                end = from;
            }
            if let Some(at) = found {
                start = Some((file, ino, at));
                break;
            }
            need -= seen.min(need);
            start = Some((file, ino, 0));
            if need == 0 {
                break;
            }
        }
        let Some((mut file, ino, at)) = start else {
            return Ok(false);
        };
        file.seek(SeekFrom::Start(at))?;
        self.switch_to(file, ino, at);
        Ok(true)
    }

    /// Reads up to `max` bytes of the log.
    pub fn read_some(&mut self, max: usize) -> io::Result<Step> {
        let mut buf = vec![0u8; max.max(1)];
        loop {
            if self.open.is_none() {
                let opened = match self.tail.take() {
                    Some(n) => self.open_tail(n)?,
                    None => self.open_oldest()?,
                };
                if !opened {
                    return Ok(Step::Idle);
                }
            }
            let Some(o) = self.open.as_mut() else {
                return Ok(Step::Idle);
            };
            let n = o.file.read(&mut buf)?;
            if n > 0 {
                o.offset += n as u64;
                return Ok(Step::Data(self.entries(&buf[..n])));
            }
            if !o.rotated {
                if ino_of(&self.live)? == Some(o.ino) {
                    // With one file kept the engine truncates it in place rather than rotating it.
                    if o.file.metadata()?.len() < o.offset {
                        use std::io::{Seek, SeekFrom};
                        o.file.seek(SeekFrom::Start(0))?;
                        o.offset = 0;
                        self.carry.clear();
                        continue;
                    }
                    return Ok(Step::Idle);
                }
                // Rotated: what the engine wrote before renaming it may have come after the read above.
                o.rotated = true;
                continue;
            }
            if !self.open_next()? {
                return Ok(Step::Idle);
            }
        }
    }

    /// The entries of `chunk` that end in it, formatted.
    fn entries(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut from = 0;
        while let Some(nl) = chunk[from..].iter().position(|b| *b == b'\n') {
            let end = from + nl;
            if self.carry.is_empty() {
                self.entry(&chunk[from..end], &mut out);
            } else {
                let mut line = std::mem::take(&mut self.carry);
                line.extend_from_slice(&chunk[from..end]);
                self.entry(&line, &mut out);
            }
            from = end + 1;
        }
        self.carry.extend_from_slice(&chunk[from..]);
        out
    }

    fn entry(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let Ok(e) = serde_json::from_slice::<Entry>(line) else {
            self.unreadable += 1;
            return;
        };
        if let Some(since) = self.since {
            match humantime::parse_rfc3339_weak(&e.time) {
                Ok(t) if t < since => return,
                _ => {}
            }
        }
        if self.timestamps {
            out.extend_from_slice(e.time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(e.log.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The engine's json-file writer, rotating as it does: the oldest deleted, the others renamed up.
    struct Writer {
        live: PathBuf,
        max_files: u32,
        file: File,
        n: u64,
    }

    impl Writer {
        fn new(live: &Path, max_files: u32) -> Self {
            Writer {
                live: live.to_path_buf(),
                max_files,
                file: File::create(live).unwrap(),
                n: 0,
            }
        }
        fn name(&self, i: u32) -> PathBuf {
            PathBuf::from(format!("{}.{i}", self.live.display()))
        }
        fn lines(&mut self, count: u64) {
            for _ in 0..count {
                self.n += 1;
                writeln!(
                    self.file,
                    r#"{{"log":"line {}\n","stream":"stdout","time":"2026-12-04T10:00:00.{:09}Z"}}"#,
                    self.n, self.n
                )
                .unwrap();
            }
        }
        fn rotate(&mut self) {
            let _ = std::fs::remove_file(self.name(self.max_files - 1));
            for i in (2..self.max_files).rev() {
                let _ = std::fs::rename(self.name(i - 1), self.name(i));
            }
            std::fs::rename(&self.live, self.name(1)).unwrap();
            self.file = File::create(&self.live).unwrap();
        }
    }

    fn drain(f: &mut Follower) -> String {
        let mut out = Vec::new();
        while let Step::Data(b) = f.read_some(100).unwrap() {
            out.extend_from_slice(&b);
        }
        String::from_utf8(out).unwrap()
    }

    fn numbers(s: &str) -> Vec<u64> {
        s.lines()
            .map(|l| l.strip_prefix("line ").unwrap().parse().unwrap())
            .collect()
    }

    #[test]
    fn a_reader_files_behind_reads_every_file_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("c-json.log");
        let mut w = Writer::new(&live, 5);
        let mut f = Follower::new(live.clone(), false, None, None);
        w.lines(3);
        assert_eq!(numbers(&drain(&mut f)), vec![1, 2, 3]);
        // Three rotations while the reader is away: it is more than two whole files behind.
        w.lines(2);
        w.rotate();
        w.lines(4);
        w.rotate();
        w.lines(4);
        w.rotate();
        w.lines(1);
        assert_eq!(
            numbers(&drain(&mut f)),
            (1..=14).skip(3).collect::<Vec<_>>()
        );
        assert_eq!(f.lost, 0);
        // Idle at the end of the live file; what comes next is read.
        assert_eq!(f.read_some(100).unwrap(), Step::Idle);
        w.lines(2);
        assert_eq!(numbers(&drain(&mut f)), vec![15, 16]);
    }

    #[test]
    fn a_reader_behind_the_caps_loses_only_deleted_files_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("c-json.log");
        let mut w = Writer::new(&live, 3);
        let mut f = Follower::new(live.clone(), false, None, None);
        w.lines(2);
        assert_eq!(
            f.read_some(10_000).unwrap(),
            Step::Data(b"line 1\nline 2\n".to_vec())
        );
        // Four rotations with 3 files kept: the reader's file and the next one are deleted.
        for _ in 0..4 {
            w.lines(2);
            w.rotate();
        }
        w.lines(1);
        let got = numbers(&drain(&mut f));
        assert_eq!(f.lost, 1);
        // The rest of the file it had open (deleted, still readable), then the files still kept, in order.
        assert_eq!(got, vec![3, 4, 7, 8, 9, 10, 11]);
    }

    #[test]
    fn tail_cuts_the_backlog_across_files_and_passes_everything_after() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("c-json.log");
        let mut w = Writer::new(&live, 5);
        w.lines(3);
        w.rotate();
        w.lines(3);
        let mut f = Follower::new(live.clone(), false, None, Some(4));
        assert_eq!(numbers(&drain(&mut f)), vec![3, 4, 5, 6]);
        w.lines(2);
        w.rotate();
        w.lines(1);
        assert_eq!(numbers(&drain(&mut f)), vec![7, 8, 9]);

        let mut none = Follower::new(live.clone(), false, None, Some(0));
        assert_eq!(drain(&mut none), "");
        w.lines(1);
        assert_eq!(numbers(&drain(&mut none)), vec![10]);
    }

    #[test]
    fn timestamps_since_partial_lines_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("c-json.log");
        let mut file = File::create(&live).unwrap();
        writeln!(
            file,
            r#"{{"log":"old\n","stream":"stdout","time":"2026-12-04T09:00:00Z"}}"#
        )
        .unwrap();
        writeln!(file, "not json").unwrap();
        writeln!(
            file,
            r#"{{"log":"new \"quoted\"\n","stream":"stderr","time":"2026-12-04T10:00:00.5Z"}}"#
        )
        .unwrap();
        // A line cut off mid-write is held until its end comes.
        write!(file, r#"{{"log":"par"#).unwrap();
        let since = humantime::parse_rfc3339("2026-12-04T09:30:00Z").unwrap();
        let mut f = Follower::new(live.clone(), true, Some(since), None);
        assert_eq!(drain(&mut f), "2026-12-04T10:00:00.5Z new \"quoted\"\n");
        assert_eq!(f.unreadable, 1);
        writeln!(
            file,
            r#"tial\n","stream":"stdout","time":"2026-12-04T10:00:01Z"}}"#
        )
        .unwrap();
        assert_eq!(drain(&mut f), "2026-12-04T10:00:01Z partial\n");
    }

    #[test]
    fn a_log_truncated_in_place_is_read_again_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("c-json.log");
        let mut w = Writer::new(&live, 5);
        w.lines(3);
        let mut f = Follower::new(live.clone(), false, None, None);
        assert_eq!(numbers(&drain(&mut f)), vec![1, 2, 3]);
        // max-file 1: the engine empties the one file and writes on.
        w.file.set_len(0).unwrap();
        w.file = std::fs::OpenOptions::new()
            .append(true)
            .open(&live)
            .unwrap();
        w.lines(2);
        assert_eq!(numbers(&drain(&mut f)), vec![4, 5]);
    }

    #[test]
    fn no_file_yet_is_idle_then_read_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("c-json.log");
        let mut f = Follower::new(live.clone(), false, None, Some(10));
        assert_eq!(f.read_some(100).unwrap(), Step::Idle);
        let mut w = Writer::new(&live, 5);
        w.lines(2);
        assert_eq!(numbers(&drain(&mut f)), vec![1, 2]);
    }
}

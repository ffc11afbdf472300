//! Worker logs: each worker's stdout and stderr go to `STATE_DIR/logs/MODEL.REPLICA.log`, which
//! the worker holds open in append mode (so it keeps writing while the agent restarts). The agent
//! bounds each file by rotating it: when it passes `MAX_BYTES` its content is copied to `.1`
//! (older copies shift up to `.KEEP`) and the file is truncated in place, which an append-mode
//! writer survives (logrotate's copytruncate).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

pub const MAX_BYTES: u64 = 10 << 20;
pub const KEEP: u32 = 3;

fn rotated(path: &Path, n: u32) -> PathBuf {
    PathBuf::from(format!("{}.{n}", path.display()))
}

/// Rotates `path` when it is larger than `max`; returns whether it did.
pub fn rotate_if_large(path: &Path, max: u64, keep: u32) -> std::io::Result<bool> {
    let Ok(meta) = fs::metadata(path) else { return Ok(false) };
    if meta.len() <= max {
        return Ok(false);
    }
    for n in (1..keep).rev() {
        let from = rotated(path, n);
        if from.exists() {
            fs::rename(&from, rotated(path, n + 1))?;
        }
    }
    // The copy appears whole (a follower never sees half of it), then the live file is cut.
    let tmp = path.with_extension("log.1.tmp");
    fs::copy(path, &tmp)?;
    fs::rename(&tmp, rotated(path, 1))?;
    OpenOptions::new().write(true).open(path)?.set_len(0)?;
    Ok(true)
}

/// The last `lines` lines of a file (all of it when `lines` is 0), and the offset it ends at.
pub fn tail(path: &Path, lines: usize) -> std::io::Result<(Vec<u8>, u64)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    // A few lines are at the end: do not read a whole 10 MiB log for them.
    if lines > 0 {
        file.seek(SeekFrom::Start(len.saturating_sub(64 << 10)))?;
    }
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    if lines == 0 {
        return Ok((buf, len));
    }
    let mut seen = 0;
    let mut start = 0;
    for (i, b) in buf.iter().enumerate().rev().skip(1) {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                start = i + 1;
                break;
            }
        }
    }
    Ok((buf[start..].to_vec(), len))
}

/// Where a follower of one log is: its offset in the live file and what the newest rotated copy
/// looked like then, so a rotation shows even when the live file has already grown past the
/// offset again.
#[derive(Debug, Clone)]
pub struct Cursor {
    pub offset: u64,
    rotated: Option<(u64, std::time::SystemTime)>,
}

impl Cursor {
    pub fn at(path: &Path, offset: u64) -> Cursor {
        Cursor { offset, rotated: signature(&rotated(path, 1)) }
    }
}

fn signature(path: &Path) -> Option<(u64, std::time::SystemTime)> {
    let meta = fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// What was appended to `path` since the cursor. After a rotation (copy, then truncate), the
/// rest of what was written before it comes from the newest copy, then the fresh file from its
/// start. Lost only: lines written between the copy and the truncation, and a whole rotation's
/// worth when two rotations happen between two reads.
pub fn read_new(path: &Path, cursor: &mut Cursor) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let now = signature(&rotated(path, 1));
    let mut buf = Vec::new();
    // A new copy counts once the live file was cut (it is shorter than the copy); between the
    // copy and the cut, the live file is read on as usual and the rotation is seen next time.
    let rotated_since = now != cursor.rotated && now.is_some_and(|(copy_len, _)| len < copy_len);
    let from = if rotated_since || len < cursor.offset {
        if rotated_since && let Ok(mut old) = File::open(rotated(path, 1)) {
            old.seek(SeekFrom::Start(cursor.offset))?;
            old.read_to_end(&mut buf)?;
        }
        0
    } else {
        cursor.offset
    };
    file.seek(SeekFrom::Start(from))?;
    let before = buf.len();
    file.read_to_end(&mut buf)?;
    cursor.offset = from + (buf.len() - before) as u64;
    if rotated_since {
        cursor.rotated = now;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_follower_reads_across_a_rotation_without_losing_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.0.log");
        let mut writer = OpenOptions::new().create(true).append(true).open(&path).unwrap();
        writeln!(writer, "one").unwrap();
        let mut cursor = Cursor::at(&path, 0);
        assert_eq!(read_new(&path, &mut cursor).unwrap(), b"one\n");
        writeln!(writer, "two {}", "x".repeat(100)).unwrap();
        assert!(rotate_if_large(&path, 50, 3).unwrap());
        writeln!(writer, "three").unwrap();
        let rest = read_new(&path, &mut cursor).unwrap();
        assert_eq!(String::from_utf8(rest).unwrap(), format!("two {}\nthree\n", "x".repeat(100)));
        assert_eq!(cursor.offset, 6);
        writeln!(writer, "four").unwrap();
        assert_eq!(read_new(&path, &mut cursor).unwrap(), b"four\n", "no rotation since: just the new line");
        // Between the copy and the cut: the live file is read on, nothing twice.
        fs::copy(&path, rotated(&path, 1)).unwrap();
        writeln!(writer, "five").unwrap();
        assert_eq!(read_new(&path, &mut cursor).unwrap(), b"five\n");
    }

    #[test]
    fn rotation_keeps_a_bounded_number_of_copies_and_writers_carry_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.0.log");
        let mut writer = OpenOptions::new().create(true).append(true).open(&path).unwrap();
        for round in 0..5 {
            writeln!(writer, "{}", format!("round {round} ").repeat(20)).unwrap();
            assert!(rotate_if_large(&path, 100, 3).unwrap(), "round {round}");
        }
        writeln!(writer, "after").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "after\n", "the writer goes on at the start");
        assert!(fs::read_to_string(rotated(&path, 1)).unwrap().starts_with("round 4"));
        assert!(fs::read_to_string(rotated(&path, 3)).unwrap().starts_with("round 2"));
        assert!(!rotated(&path, 4).exists());
        assert!(!rotate_if_large(&path, 100, 3).unwrap(), "small files stay");
    }

    #[test]
    fn tail_and_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.log");
        fs::write(&path, "a\nb\nc\n").unwrap();
        assert_eq!(tail(&path, 2).unwrap().0, b"b\nc\n");
        assert_eq!(tail(&path, 0).unwrap().0, b"a\nb\nc\n");
        assert_eq!(tail(&path, 9).unwrap().0, b"a\nb\nc\n");
        let (_, end) = tail(&path, 1).unwrap();
        fs::write(&path, "a\nb\nc\nd\n").unwrap();
        let mut cursor = Cursor::at(&path, end);
        assert_eq!(read_new(&path, &mut cursor).unwrap(), b"d\n");
        fs::write(&path, "x\n").unwrap();
        assert_eq!(read_new(&path, &mut cursor).unwrap(), b"x\n", "truncated: from the start");
    }
}

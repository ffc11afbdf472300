//! `control.log` and `server.log` in the real tool's line format,
//! `[YYYY-MM-DD HH:MM:SS.mmm Role  PID] message` (UTC here; the probe's host ran in UTC too).
//! Tests and operators grep these lines, so the wording follows the probe where it shows any.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// One append-only log file; lines from many threads never interleave.
pub struct LogFile {
    file: Mutex<File>,
    role: &'static str,
}

impl LogFile {
    pub fn open(path: &Path, role: &'static str) -> std::io::Result<LogFile> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LogFile { file: Mutex::new(file), role })
    }

    /// Writes one line attributed to `pid` (the daemon's, or a server's as the probe shows).
    /// A full disk must not take the daemon down, so write errors are dropped.
    pub fn line(&self, pid: u32, message: &str) {
        let text = format_line(SystemTime::now(), self.role, pid, message);
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = file.write_all(text.as_bytes());
    }
}

/// `[2026-11-30 01:05:34.300 Control   448] NEW UI\n`. The pid is right-aligned in five columns,
/// which gives the probe's three spaces for three-digit pids (other widths unverified).
pub fn format_line(now: SystemTime, role: &str, pid: u32, message: &str) -> String {
    format!("[{} {role} {pid:>5}] {message}\n", timestamp(now))
}

/// `YYYY-MM-DD HH:MM:SS.mmm` in UTC, without pulling in a date crate.
pub fn timestamp(now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn probe_format() {
        // 2026-11-30 01:05:34.300 UTC
        let t = UNIX_EPOCH + Duration::from_millis(1_796_000_734_300);
        assert_eq!(format_line(t, "Control", 448, "NEW UI"), "[2026-11-30 01:05:34.300 Control   448] NEW UI\n");
        assert_eq!(format_line(t, "Server", 483, "x"), "[2026-11-30 01:05:34.300 Server   483] x\n");
    }

    #[test]
    fn dates() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01 00:00:00.000");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(timestamp(leap), "2000-02-29 00:00:00.000");
        let end = UNIX_EPOCH + Duration::from_secs(1_767_225_599); // 2025-12-31 23:59:59
        assert_eq!(timestamp(end), "2025-12-31 23:59:59.000");
    }
}

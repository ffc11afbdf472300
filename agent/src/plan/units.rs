//! Sizes ("6GiB", "512MiB", "20GB") and durations ("5s", "250ms") as plans write them.

use std::time::Duration;

const UNITS: &[(&str, u64)] = &[
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("B", 1),
];

/// Parses a size with a unit into bytes. A bare number is refused: "6" is far more likely a
/// mistake than six bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let unit = UNITS.iter().find(|(suffix, _)| text.ends_with(suffix));
    let Some((suffix, scale)) = unit else {
        return Err(format!(
            "{text:?} is not a size: write a number and a unit, e.g. \"6GiB\" or \"512MiB\" (units: KiB MiB GiB TiB KB MB GB TB B)"
        ));
    };
    let number = text[..text.len() - suffix.len()].trim();
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("{text:?} is not a size: {number:?} is not a positive number"))?;
    let bytes = value * *scale as f64;
    if bytes >= u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Bytes to MiB, rounding up so a budget never shrinks.
pub fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// The longest duration a plan may give (a day): longer ones are mistakes, and would overflow
/// deadline arithmetic.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}): write e.g. \"5s\", \"250ms\" or \"1m\""))?;
    if d.is_zero() {
        return Err(format!("{text:?}: a duration must be longer than zero"));
    }
    if d > MAX_DURATION {
        return Err(format!("{text:?} is longer than the 24h a plan may give"));
    }
    Ok(d)
}

/// MiB as a short human figure: "6 GiB", "512 MiB", "1.5 GiB".
pub fn human_mib(mib: u64) -> String {
    if mib >= 1024 {
        let gib = mib as f64 / 1024.0;
        if gib.fract() == 0.0 { format!("{gib:.0} GiB") } else { format!("{gib:.1} GiB") }
    } else {
        format!("{mib} MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let ok = [
            ("6GiB", 6 << 30),
            ("512MiB", 512 << 20),
            ("1.5GiB", 3 << 29),
            ("20GB", 20_000_000_000),
            (" 8 GiB ", 8 << 30),
            ("100B", 100),
        ];
        for (text, want) in ok {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for bad in ["6", "GiB", "-1GiB", "0GiB", "six GiB", "6 parsecs", ""] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["5", "0s", "soon", "", "25h", "18446744073709551615s", "500000000000years"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn human() {
        assert_eq!(human_mib(6144), "6 GiB");
        assert_eq!(human_mib(1536), "1.5 GiB");
        assert_eq!(human_mib(512), "512 MiB");
    }
}

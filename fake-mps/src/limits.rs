//! Values of the MPS knobs, parsed the way the real tool accepts them: thread percentages
//! (`25`, `12.5`) and pinned device memory sizes (`4G`, `4096M`, `512MB`), and the client-side
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` list (`0=4G,1=512M`). Kept pure so tables test it.

/// A pinned device memory limit: the text as it was set (the daemon prints it back verbatim)
/// and its size in MiB (what clients are held to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemLimit {
    pub spec: String,
    pub mib: u64,
}

/// Parses `4G`, `4096M`, `512MB`, `1024K`, `1T` (case-insensitive). A bare number counts as
/// bytes (unverified: the probe only shows suffixed values). Sizes round down to whole MiB.
pub fn parse_mem(text: &str) -> Option<MemLimit> {
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    let upper = upper.strip_suffix('B').filter(|s| s.ends_with(['K', 'M', 'G', 'T'])).unwrap_or(&upper);
    let (number, unit): (&str, f64) = match upper.chars().last()? {
        'K' => (&upper[..upper.len() - 1], 1.0 / 1024.0),
        'M' => (&upper[..upper.len() - 1], 1.0),
        'G' => (&upper[..upper.len() - 1], 1024.0),
        'T' => (&upper[..upper.len() - 1], 1024.0 * 1024.0),
        _ => (upper, 1.0 / (1024.0 * 1024.0)),
    };
    let value: f64 = number.parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0)?;
    Some(MemLimit { spec: t.to_string(), mib: (value * unit).floor() as u64 })
}

/// Parses an active thread percentage: a number in (0, 100].
pub fn parse_pct(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|p| p.is_finite() && *p > 0.0 && *p <= 100.0)
}

/// Formats a percentage as the tool prints it (`100.0`, `12.5`).
pub fn format_pct(pct: f64) -> String {
    format!("{pct:.1}")
}

/// The limit for device `device` in a `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` list; `Err` names the
/// entry that does not parse.
pub fn device_limit(list: &str, device: u32) -> Result<Option<MemLimit>, String> {
    let mut found = None;
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (dev, size) = entry.split_once('=').ok_or_else(|| entry.to_string())?;
        let dev: u32 = dev.trim().parse().map_err(|_| entry.to_string())?;
        let size = parse_mem(size).ok_or_else(|| entry.to_string())?;
        if dev == device {
            found = Some(size);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let cases = [
            ("4G", Some(4096)),
            ("4g", Some(4096)),
            ("4096M", Some(4096)),
            ("512MB", Some(512)),
            ("1.5G", Some(1536)),
            ("2048K", Some(2)),
            ("1T", Some(1024 * 1024)),
            ("1073741824", Some(1024)),
            ("", None),
            ("G", None),
            ("-1G", None),
            ("4X", None),
            ("B", None),
        ];
        for (text, mib) in cases {
            assert_eq!(parse_mem(text).map(|l| l.mib), mib, "{text:?}");
        }
        assert_eq!(parse_mem(" 4G ").unwrap().spec, "4G");
    }

    #[test]
    fn percentages() {
        assert_eq!(parse_pct("25"), Some(25.0));
        assert_eq!(parse_pct("12.5"), Some(12.5));
        for bad in ["0", "101", "x", "-5", "NaN", "inf"] {
            assert_eq!(parse_pct(bad), None, "{bad}");
        }
        assert_eq!(format_pct(100.0), "100.0");
        assert_eq!(format_pct(12.5), "12.5");
    }

    #[test]
    fn device_lists() {
        assert_eq!(device_limit("0=4096M", 0).unwrap().unwrap().mib, 4096);
        assert_eq!(device_limit("0=4G,1=512M", 1).unwrap().unwrap().mib, 512);
        assert_eq!(device_limit("1=512M", 0).unwrap(), None);
        assert_eq!(device_limit("", 0).unwrap(), None);
        assert_eq!(device_limit("0=lots", 0).unwrap_err(), "0=lots");
        assert_eq!(device_limit("4G", 0).unwrap_err(), "4G");
    }
}

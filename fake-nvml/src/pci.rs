//! PCI bus ids: `domain:bus:device.function` in hex, as the state keeps them
//! (`00000000:18:00.0`) and as callers pass them (also `0000:18:00.0` or `18:00.0`).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusId {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl BusId {
    /// Parses `[domain:]bus:device.function`; a missing domain is 0, as NVML takes it.
    pub fn parse(s: &str) -> Option<BusId> {
        let hex = |part: &str| {
            let ok = !part.is_empty() && part.len() <= 8;
            ok.then(|| u32::from_str_radix(part, 16).ok()).flatten()
        };
        let parts: Vec<&str> = s.trim().split(':').collect();
        let (domain, bus, rest) = match parts[..] {
            [domain, bus, rest] => (hex(domain)?, bus, rest),
            [bus, rest] => (0, bus, rest),
            _ => return None,
        };
        let (device, function) = rest.split_once('.')?;
        Some(BusId { domain, bus: hex(bus)?, device: hex(device)?, function: hex(function)? })
    }

    /// `NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT`: `%04X:%02X:%02X.0`.
    pub fn legacy(&self) -> String {
        format!("{:04X}:{:02X}:{:02X}.{:X}", self.domain, self.bus, self.device, self.function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_nvml_takes() {
        let id = |domain, bus, device, function| Some(BusId { domain, bus, device, function });
        let cases = [
            ("00000000:18:00.0", id(0, 0x18, 0, 0)),
            ("00000000:00:06.0", id(0, 0, 6, 0)),
            ("0000:18:00.0", id(0, 0x18, 0, 0)),
            ("18:00.0", id(0, 0x18, 0, 0)),
            ("00000001:af:1f.1", id(1, 0xaf, 0x1f, 1)),
            ("0000:AF:00.0", id(0, 0xaf, 0, 0)),
            ("", None),
            ("18:00", None),
            ("zz:00.0", None),
            ("0:0:0:0.0", None),
            ("000000000:18:00.0", None),
        ];
        for (input, want) in cases {
            assert_eq!(BusId::parse(input), want, "{input:?}");
        }
    }

    #[test]
    fn legacy_form() {
        assert_eq!(BusId::parse("00000000:9a:00.0").unwrap().legacy(), "0000:9A:00.0");
        assert_eq!(BusId::parse("00000000:00:06.0").unwrap().legacy(), "0000:00:06.0");
    }
}

//! The line protocol on the fake daemon's `control` socket. It is this fake's own (the real one
//! is undocumented); only the fake's command interface and `client` speak it.
//!
//! The first line names the peer:
//! - `UI`: a command interface. Then one command per line; each reply is framed as `<len>\n`
//!   followed by exactly `len` bytes, the text the tool prints (possibly empty).
//! - `CLIENT <pid> <uid> <pct|-> <limits|->`: an MPS client (the fake libcuda). The daemon answers
//!   `OK <server_pid> <pct> <limit_mib|->` once a server takes it (the client blocks while it is
//!   pending) or `ERR <why>`; later it may send `FAULT <why>` or `TERMINATE`, and the connection
//!   closing means the daemon is gone.

use std::io::{BufRead, Write};

pub const UI_HELLO: &str = "UI";

/// What an MPS client asks for when it connects.
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    pub pid: u32,
    pub uid: u32,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, if set.
    pub active_thread_pct: Option<f64>,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` as given (`0=4096M,1=1G`), if set.
    pub pinned_limits: Option<String>,
}

impl Hello {
    pub fn to_line(&self) -> String {
        let pct = self.active_thread_pct.map_or("-".to_string(), |p| p.to_string());
        let limits = match self.pinned_limits.as_deref().map(str::trim) {
            Some(l) if !l.is_empty() => l.replace(char::is_whitespace, ""),
            _ => "-".to_string(),
        };
        format!("CLIENT {} {} {pct} {limits}\n", self.pid, self.uid)
    }

    pub fn parse(line: &str) -> Option<Hello> {
        let mut words = line.split_whitespace();
        if words.next()? != "CLIENT" {
            return None;
        }
        let pid = words.next()?.parse().ok()?;
        let uid = words.next()?.parse().ok()?;
        let pct = match words.next()? {
            "-" => None,
            p => Some(p.parse().ok()?),
        };
        let pinned_limits = match words.next()? {
            "-" => None,
            l => Some(l.to_string()),
        };
        words.next().is_none().then_some(Hello { pid, uid, active_thread_pct: pct, pinned_limits })
    }
}

/// The daemon's answer once a server takes the client.
#[derive(Debug, Clone, PartialEq)]
pub struct Granted {
    pub server_pid: u32,
    pub active_thread_pct: f64,
    pub pinned_limit_mib: Option<u64>,
}

impl Granted {
    pub fn to_line(&self) -> String {
        let limit = self.pinned_limit_mib.map_or("-".to_string(), |m| m.to_string());
        format!("OK {} {} {limit}\n", self.server_pid, crate::limits::format_pct(self.active_thread_pct))
    }

    pub fn parse(line: &str) -> Option<Granted> {
        let mut words = line.split_whitespace();
        if words.next()? != "OK" {
            return None;
        }
        let server_pid = words.next()?.parse().ok()?;
        let active_thread_pct = words.next()?.parse().ok()?;
        let pinned_limit_mib = match words.next()? {
            "-" => None,
            m => Some(m.parse().ok()?),
        };
        Some(Granted { server_pid, active_thread_pct, pinned_limit_mib })
    }
}

pub fn fault_line(why: &str) -> String {
    format!("FAULT {why}\n")
}

pub const TERMINATE_LINE: &str = "TERMINATE\n";

/// Writes one framed UI reply.
pub fn write_reply(out: &mut impl Write, text: &str) -> std::io::Result<()> {
    out.write_all(format!("{}\n{text}", text.len()).as_bytes())?;
    out.flush()
}

/// Reads one framed UI reply; `None` when the daemon closed the connection first.
pub fn read_reply(input: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut len = String::new();
    if input.read_line(&mut len)? == 0 {
        return Ok(None);
    }
    let len: usize = len
        .trim()
        .parse()
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad reply length {len:?}")))?;
    let mut text = vec![0; len];
    input.read_exact(&mut text)?;
    Ok(Some(String::from_utf8_lossy(&text).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip() {
        let h = Hello { pid: 464, uid: 0, active_thread_pct: Some(25.0), pinned_limits: Some("0=4096M".into()) };
        assert_eq!(h.to_line(), "CLIENT 464 0 25 0=4096M\n");
        assert_eq!(Hello::parse(&h.to_line()), Some(h));
        let bare = Hello { pid: 1, uid: 1000, active_thread_pct: None, pinned_limits: None };
        assert_eq!(bare.to_line(), "CLIENT 1 1000 - -\n");
        assert_eq!(Hello::parse(&bare.to_line()), Some(bare));
        for bad in ["", "UI", "CLIENT x 0 - -", "CLIENT 1 0 - - extra", "CLIENT 1 0 -"] {
            assert_eq!(Hello::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn granted_round_trip() {
        let g = Granted { server_pid: 483, active_thread_pct: 25.0, pinned_limit_mib: Some(4096) };
        assert_eq!(g.to_line(), "OK 483 25.0 4096\n");
        assert_eq!(Granted::parse(&g.to_line()), Some(g));
        let g = Granted { server_pid: 483, active_thread_pct: 100.0, pinned_limit_mib: None };
        assert_eq!(Granted::parse(&g.to_line()), Some(g));
    }

    #[test]
    fn replies_are_framed() {
        let mut buf = Vec::new();
        write_reply(&mut buf, "498\n499\n").unwrap();
        write_reply(&mut buf, "").unwrap();
        let mut input = std::io::Cursor::new(buf);
        assert_eq!(read_reply(&mut input).unwrap().as_deref(), Some("498\n499\n"));
        assert_eq!(read_reply(&mut input).unwrap().as_deref(), Some(""));
        assert_eq!(read_reply(&mut input).unwrap(), None);
    }
}

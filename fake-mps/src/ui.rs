//! The command interface: `echo CMD | nvidia-cuda-mps-control`. Reads commands from stdin, one
//! per line, sends each to the daemon over one connection, and prints each reply as the real tool
//! does (nothing for an empty reply). No daemon: `Cannot find MPS control daemon process` and
//! exit 1, as the probe saw after `quit` (the probe does not say which stream; stderr here).

use crate::env::{CONTROL_SOCKET, Config};
use crate::wire;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;

const NO_DAEMON: &str = "Cannot find MPS control daemon process";

pub fn run(config: &Config) -> i32 {
    let Ok(mut stream) = UnixStream::connect(config.pipe_dir.join(CONTROL_SOCKET)) else {
        eprintln!("{NO_DAEMON}");
        return 1;
    };
    let Ok(read_half) = stream.try_clone() else {
        eprintln!("{NO_DAEMON}");
        return 1;
    };
    let mut replies = BufReader::new(read_half);
    if stream.write_all(format!("{}\n", wire::UI_HELLO).as_bytes()).is_err() {
        eprintln!("{NO_DAEMON}");
        return 1;
    }
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let command = line.trim();
        if command.is_empty() {
            continue;
        }
        let sent = stream.write_all(format!("{command}\n").as_bytes());
        let reply = sent.and_then(|()| wire::read_reply(&mut replies));
        match reply {
            Ok(Some(text)) => {
                let mut out = stdout.lock();
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            // The daemon went away (a `quit` raced with a new connection, or it died).
            Ok(None) | Err(_) => {
                eprintln!("{NO_DAEMON}");
                return 1;
            }
        }
        if command.split_whitespace().next() == Some("quit") {
            // The daemon closes this connection by exiting: return only once it is gone, so
            // `quit` then `-d` never meets the old one.
            let _ = replies.read_to_end(&mut Vec::new());
            return 0;
        }
    }
    0
}

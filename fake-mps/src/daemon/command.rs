//! The control commands, parsed from one line of the command interface. Pure, so a table tests
//! every spelling; the daemon's state carries them out.

use crate::limits::{MemLimit, parse_mem, parse_pct};

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    GetServerList,
    GetServerStatus(u32),
    StartServer {
        uid: u32,
    },
    GetClientList(u32),
    Ps,
    TerminateClient {
        server: u32,
        client: u32,
    },
    Quit,
    SetDefaultActiveThreadPct(f64),
    GetDefaultActiveThreadPct,
    SetActiveThreadPct {
        server: u32,
        pct: f64,
    },
    SetDefaultPinnedLimit {
        device: u32,
        limit: MemLimit,
    },
    GetDefaultPinnedLimit {
        device: u32,
    },
    SetPinnedLimit {
        server: u32,
        device: u32,
        limit: MemLimit,
    },
    SetDefaultClientPriority(u8),
    /// Test-only extension, not in the real tool: a fatal fault on this server.
    FakeFault(u32),
    /// Not a command the tool knows: prints `Unknown command "X"`.
    Unknown(String),
    /// A known command with bad arguments; the text is what the daemon answers (unverified).
    Invalid(String),
}

pub fn parse(line: &str) -> Command {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&name, args)) = words.split_first() else {
        return Command::Unknown(String::new());
    };
    let invalid = || Command::Invalid(format!("Invalid arguments for \"{name}\""));
    let num = |i: usize| args.get(i).and_then(|a| a.parse::<u32>().ok());
    let parsed = match (name, args.len()) {
        ("get_server_list", 0) => Some(Command::GetServerList),
        ("get_server_status", 1) => num(0).map(Command::GetServerStatus),
        ("start_server", 2) if args[0] == "-uid" => num(1).map(|uid| Command::StartServer { uid }),
        ("get_client_list", 1) => num(0).map(Command::GetClientList),
        // `ps -p PID` filters by client pid in the real tool; the fake lists all (unverified).
        ("ps", 0 | 2) => Some(Command::Ps),
        ("terminate_client", 2) => {
            num(0).zip(num(1)).map(|(server, client)| Command::TerminateClient { server, client })
        }
        // `quit -t TIMEOUT` waits for clients in the real tool; the fake quits at once.
        ("quit", _) => Some(Command::Quit),
        ("set_default_active_thread_percentage", 1) => parse_pct(args[0]).map(Command::SetDefaultActiveThreadPct),
        ("get_default_active_thread_percentage", 0) => Some(Command::GetDefaultActiveThreadPct),
        ("set_active_thread_percentage", 2) => {
            num(0).zip(parse_pct(args[1])).map(|(server, pct)| Command::SetActiveThreadPct { server, pct })
        }
        ("set_default_device_pinned_mem_limit", 2) => {
            num(0).zip(parse_mem(args[1])).map(|(device, limit)| Command::SetDefaultPinnedLimit { device, limit })
        }
        ("get_default_device_pinned_mem_limit", 1) => num(0).map(|device| Command::GetDefaultPinnedLimit { device }),
        ("set_device_pinned_mem_limit", 3) => num(0)
            .zip(num(1))
            .zip(parse_mem(args[2]))
            .map(|((server, device), limit)| Command::SetPinnedLimit { server, device, limit }),
        ("set_default_client_priority", 1) => match args[0] {
            "0" => Some(Command::SetDefaultClientPriority(0)),
            "1" => Some(Command::SetDefaultClientPriority(1)),
            _ => None,
        },
        ("fake_fault", 1) => num(0).map(Command::FakeFault),
        (
            "get_server_list"
            | "get_server_status"
            | "start_server"
            | "get_client_list"
            | "ps"
            | "terminate_client"
            | "set_default_active_thread_percentage"
            | "get_default_active_thread_percentage"
            | "set_active_thread_percentage"
            | "set_default_device_pinned_mem_limit"
            | "get_default_device_pinned_mem_limit"
            | "set_device_pinned_mem_limit"
            | "set_default_client_priority"
            | "fake_fault",
            _,
        ) => None,
        _ => return Command::Unknown(name.to_string()),
    };
    parsed.unwrap_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(spec: &str) -> MemLimit {
        parse_mem(spec).unwrap()
    }

    #[test]
    fn table() {
        let cases = [
            ("get_server_list", Command::GetServerList),
            ("  get_server_status 531 ", Command::GetServerStatus(531)),
            ("start_server -uid 1000", Command::StartServer { uid: 1000 }),
            ("get_client_list 531", Command::GetClientList(531)),
            ("ps", Command::Ps),
            ("terminate_client 531 498", Command::TerminateClient { server: 531, client: 498 }),
            ("quit", Command::Quit),
            ("quit -t 5", Command::Quit),
            ("set_default_active_thread_percentage 25", Command::SetDefaultActiveThreadPct(25.0)),
            ("get_default_active_thread_percentage", Command::GetDefaultActiveThreadPct),
            ("set_active_thread_percentage 531 12.5", Command::SetActiveThreadPct { server: 531, pct: 12.5 }),
            (
                "set_default_device_pinned_mem_limit 0 4G",
                Command::SetDefaultPinnedLimit { device: 0, limit: mem("4G") },
            ),
            ("get_default_device_pinned_mem_limit 0", Command::GetDefaultPinnedLimit { device: 0 }),
            (
                "set_device_pinned_mem_limit 531 0 4096M",
                Command::SetPinnedLimit { server: 531, device: 0, limit: mem("4096M") },
            ),
            ("set_default_client_priority 1", Command::SetDefaultClientPriority(1)),
            ("fake_fault 531", Command::FakeFault(531)),
            ("bogus_command", Command::Unknown("bogus_command".into())),
            ("bogus_command 1 2", Command::Unknown("bogus_command".into())),
            ("get_server_status", Command::Invalid("Invalid arguments for \"get_server_status\"".into())),
            ("get_server_status x", Command::Invalid("Invalid arguments for \"get_server_status\"".into())),
            (
                "set_default_active_thread_percentage 0",
                Command::Invalid("Invalid arguments for \"set_default_active_thread_percentage\"".into()),
            ),
            (
                "set_default_client_priority 2",
                Command::Invalid("Invalid arguments for \"set_default_client_priority\"".into()),
            ),
            ("start_server 1000", Command::Invalid("Invalid arguments for \"start_server\"".into())),
        ];
        for (line, want) in cases {
            assert_eq!(parse(line), want, "{line:?}");
        }
    }
}

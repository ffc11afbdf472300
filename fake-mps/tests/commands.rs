//! The daemon's start-up, pipe directory, command interface replies and shutdown, against the
//! built `fake-mps-control` binary, as the agent drives it.

mod common;

use common::{Daemon, alive, exists, wait_until};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

#[test]
fn start_lays_out_the_pipe_directory_and_refuses_a_second_daemon() {
    let daemon = Daemon::start();
    let pid = daemon.pid.unwrap();
    assert!(alive(pid as u32));
    let meta = |name: &str| std::fs::symlink_metadata(daemon.pipe.join(name)).unwrap();
    assert!(meta("control").file_type().is_socket());
    assert_eq!(meta("control").permissions().mode() & 0o777, 0o666);
    assert!(meta("control_privileged").file_type().is_socket());
    assert_eq!(meta("control_privileged").permissions().mode() & 0o777, 0o755);
    assert!(meta("log").file_type().is_fifo());
    assert!(meta("control_lock").is_file());
    assert_eq!(meta("nvidia-cuda-mps-control.pid").permissions().mode() & 0o777, 0o666);
    // The daemon survives its `-d` parent, in its own session.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    assert_eq!(fields[3], pid.to_string(), "session id: {stat}");

    let out = daemon.command().arg("-d").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already running") && err.contains(&daemon.pipe.display().to_string()), "{err}");
    assert!(alive(pid as u32), "the first daemon is unharmed");
}

#[test]
fn replies_as_the_real_tool() {
    let daemon = Daemon::start();
    let cases = [
        ("get_server_list", ""),
        ("get_default_active_thread_percentage", "100.0\n"),
        ("set_default_active_thread_percentage 25", ""),
        ("get_default_active_thread_percentage", "25.0\n"),
        ("get_default_device_pinned_mem_limit 0", ""),
        ("set_default_device_pinned_mem_limit 0 4G", ""),
        ("get_default_device_pinned_mem_limit 0", "4G\n"),
        ("set_default_device_pinned_mem_limit 0 4096M", ""),
        ("get_default_device_pinned_mem_limit 0", "4096M\n"),
        ("get_default_device_pinned_mem_limit 1", ""),
        ("set_default_client_priority 1", ""),
        ("bogus_command", "Unknown command \"bogus_command\"\n"),
        ("get_server_status 999999", "Server PID not found\n"),
        ("get_client_list 999999", "Server PID not found\n"),
        ("ps", "PID ID SERVER DEVICE NAMESPACE COMMAND\n"),
    ];
    for (command, want) in cases {
        assert_eq!(daemon.ask(command), want, "{command}");
    }
    // Several commands on one stdin: each reply in order.
    let out = daemon.ctl("get_default_active_thread_percentage\nbogus\n\nget_server_list\n");
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "25.0\nUnknown command \"bogus\"\n");

    let log = daemon.control_log();
    for line in ["NEW UI", "Cmd:get_server_list", "Cmd:bogus_command", "UI closed"] {
        assert!(log.contains(&format!("] {line}\n")), "{line} in {log}");
    }
    let pid = daemon.pid.unwrap();
    let first = log.lines().find(|l| l.ends_with("] NEW UI")).unwrap();
    // [YYYY-MM-DD HH:MM:SS.mmm Control   PID] NEW UI
    let (stamp, rest) = first[1..].split_at(23);
    assert!(stamp.as_bytes()[4] == b'-' && stamp.as_bytes()[10] == b' ' && stamp.as_bytes()[19] == b'.', "{first}");
    assert_eq!(rest, format!(" Control {pid:>5}] NEW UI"));
}

#[test]
fn quit_leaves_the_sockets_and_nothing_answers_after_it() {
    let mut daemon = Daemon::start();
    let pid = daemon.pid.unwrap() as u32;
    assert_eq!(daemon.ask("start_server -uid 0"), "");
    wait_until("a server", || daemon.server_list().len() == 1);
    let server = daemon.server_list()[0];

    let out = daemon.ctl("quit\n");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"");
    wait_until("the daemon to exit", || !alive(pid));
    wait_until("its server to exit", || !alive(server));

    let out = daemon.ctl("get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "Cannot find MPS control daemon process");
    for name in ["control", "control_lock", "control_privileged"] {
        assert!(exists(&daemon.pipe, name), "{name} stays");
    }
    assert!(!exists(&daemon.pipe, "nvidia-cuda-mps-control.pid"));

    // Defaults are lost on quit; a new daemon on the same directory starts at once.
    daemon.launch();
    assert_ne!(daemon.pid, Some(pid as i32));
    assert_eq!(daemon.ask("get_default_active_thread_percentage"), "100.0\n");
}

#[test]
fn no_daemon_means_exit_1() {
    let daemon = Daemon::unstarted(&[]);
    let out = daemon.ctl("get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "Cannot find MPS control daemon process");
    assert_eq!(out.stdout, b"");
}

#[test]
fn sigterm_stops_the_daemon_and_its_server() {
    let daemon = Daemon::start();
    let pid = daemon.pid.unwrap() as u32;
    daemon.ask("start_server -uid 0");
    wait_until("a server", || daemon.server_list().len() == 1);
    let server = daemon.server_list()[0];
    daemon.kill(libc::SIGTERM);
    wait_until("the daemon to exit", || !alive(pid));
    wait_until("its server to exit", || !alive(server));
    assert!(!exists(&daemon.pipe, "nvidia-cuda-mps-control.pid"));
    assert!(daemon.control_log().contains("Caught SIGTERM"));
}

#[test]
fn a_server_is_initializing_until_ready() {
    let daemon = Daemon::start_with(&[("FAKE_MPS_SERVER_START_MS", "600")]);
    daemon.ask("start_server -uid 0");
    let server = daemon.server_list()[0];
    assert_eq!(daemon.ask(&format!("get_server_status {server}")), "INITIALIZING\n");
    wait_until("ACTIVE", || daemon.ask(&format!("get_server_status {server}")) == "ACTIVE\n");
    assert!(daemon.control_log().contains(&format!("] NEW SERVER {server}: Ready\n")));
}

#[test]
fn a_daemon_whose_pipe_directory_is_deleted_exits() {
    let daemon = Daemon::start();
    let pid = daemon.pid.unwrap() as u32;
    daemon.ask("start_server -uid 0");
    wait_until("a server", || daemon.server_list().len() == 1);
    let server = daemon.server_list()[0];
    std::fs::remove_dir_all(&daemon.pipe).unwrap();
    wait_until("the orphaned daemon to exit", || !alive(pid));
    wait_until("its server to exit", || !alive(server));
}

#[test]
fn the_daemon_keeps_no_descriptor_its_starter_leaked() {
    // A pipe without close-on-exec, as a careless caller leaks it to `-d`.
    let (read, write) = nix::unistd::pipe().unwrap();
    let mut daemon = Daemon::unstarted(&[]);
    daemon.launch();
    drop(write);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::fs::File::from(read), &mut buf);
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(5)).expect("end of file: nobody holds the pipe any more");
    assert!(alive(daemon.pid.unwrap() as u32));
}

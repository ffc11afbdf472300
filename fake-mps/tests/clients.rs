//! MPS clients (the fake libcuda side) against the built daemon: lazy server start, limits,
//! terminate_client, faults, a killed daemon, and two users taking turns.

mod common;

use common::{Daemon, alive, wait_until};
use fake_mps::client::{self, Error, Hello, Lost};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(5);

fn hello(pid: u32, pct: Option<f64>, limits: Option<&str>) -> Hello {
    Hello { pid, uid: 0, active_thread_pct: pct, pinned_limits: limits.map(String::from) }
}

#[test]
fn the_first_client_starts_a_server_lazily() {
    let sim_dir = tempfile::tempdir().unwrap();
    let state = sim_dir.path().join("nvml.json");
    let host = gpu_sim::SimHost::prepare(&state, &"h200:2".parse().unwrap()).unwrap();
    let uuid = host.gpus[1].uuid.clone();
    let daemon =
        Daemon::start_with(&[("GPU_SIM_STATE", state.to_str().unwrap()), ("CUDA_VISIBLE_DEVICES", uuid.as_str())]);
    assert!(daemon.server_list().is_empty(), "no server before a client");

    let me = std::process::id();
    let client = daemon.client(me, 0);
    let server = client.server_pid;
    assert!(alive(server));
    assert_eq!((client.active_thread_pct, client.pinned_limit_mib), (100.0, None));
    assert_eq!(daemon.server_list(), [server]);
    assert_eq!(daemon.ask(&format!("get_server_status {server}")), "ACTIVE\n");
    assert_eq!(daemon.ask(&format!("get_client_list {server}")), format!("{me}\n"));
    let cmdline = std::fs::read_to_string(format!("/proc/{server}/cmdline")).unwrap();
    assert!(cmdline.contains("--fake-mps-server"), "{cmdline:?}");

    let ns = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let short_uuid = uuid.split('-').take(4).collect::<Vec<_>>().join("-");
    assert_eq!(
        daemon.ask("ps"),
        format!("PID ID SERVER DEVICE NAMESPACE COMMAND\n{me} 1 {server} {short_uuid} {ns} {}\n", exe.display())
    );

    // The server is in the simulated driver's process list, as nvidia-cuda-mps-server is.
    let procs = gpu_sim::SimHost::load(&state).unwrap().gpus[1].processes.clone();
    assert_eq!(procs, [gpu_sim::SimProcess { pid: server, used_mib: 66, gpu_instance_id: None, mps_client: false }]);

    let log = daemon.control_log();
    let daemon_pid = daemon.pid.unwrap();
    for line in [
        format!(
            "Control {daemon_pid:>5}] NEW CLIENT {me} from user 0: Server is not ready, push client to pending list\n"
        ),
        format!("Control {server:>5}] Starting new server {server} for user 0\n"),
        format!("Control {daemon_pid:>5}] NEW SERVER {server}: Ready\n"),
    ] {
        assert!(log.contains(&line), "{line:?} in\n{log}");
    }
    assert!(
        daemon.server_log().contains(&format!("Server {server:>5}] Client {{PID: {me}, Context ID: 1}} connected\n"))
    );

    // A second client finds the server running.
    let second = daemon.client(me + 1_000_000, 0);
    assert_eq!(second.server_pid, server);
    assert!(
        daemon.control_log().contains(&format!("NEW CLIENT {} from user 0: Server already exists", me + 1_000_000))
    );

    drop(client);
    wait_until("the disconnect", || daemon.server_log().contains(&format!("Client process {me} disconnected\n")));
    drop(second);
    wait_until("no clients", || daemon.ask(&format!("get_client_list {server}")).is_empty());
    assert_eq!(daemon.server_list(), [server], "the server stays without clients");

    daemon.ask("quit");
    wait_until("the server to leave the simulated driver", || {
        gpu_sim::SimHost::load(&state).unwrap().gpus.iter().all(|g| g.processes.is_empty())
    });
}

#[test]
fn defaults_apply_to_servers_started_after_they_are_set() {
    let daemon = Daemon::start();
    daemon.ask("set_default_active_thread_percentage 25");
    daemon.ask("set_default_device_pinned_mem_limit 0 2G");
    let plain = daemon.client_with(&hello(900_001, None, None));
    assert_eq!((plain.active_thread_pct, plain.pinned_limit_mib), (25.0, Some(2048)));
    let server = plain.server_pid;
    // A client may only tighten the percentage; its own pinned limit wins.
    let tighter = daemon.client_with(&hello(900_002, Some(10.0), Some("0=1G,1=4G")));
    assert_eq!((tighter.active_thread_pct, tighter.pinned_limit_mib), (10.0, Some(1024)));
    let looser = daemon.client_with(&hello(900_003, Some(50.0), Some("1=4G")));
    assert_eq!((looser.active_thread_pct, looser.pinned_limit_mib), (25.0, Some(2048)));

    // New defaults do not reach the running server; per-server settings do (for new clients).
    daemon.ask("set_default_active_thread_percentage 50");
    daemon.ask("set_default_device_pinned_mem_limit 0 8G");
    let later = daemon.client_with(&hello(900_004, None, None));
    assert_eq!((later.active_thread_pct, later.pinned_limit_mib), (25.0, Some(2048)));
    assert_eq!(daemon.ask(&format!("set_active_thread_percentage {server} 30")), "");
    assert_eq!(daemon.ask(&format!("set_device_pinned_mem_limit {server} 0 512M")), "");
    let last = daemon.client_with(&hello(900_005, None, None));
    assert_eq!((last.active_thread_pct, last.pinned_limit_mib), (30.0, Some(512)));
    assert_eq!((plain.active_thread_pct, plain.pinned_limit_mib), (25.0, Some(2048)), "old clients keep theirs");
}

#[test]
fn client_env_is_read_by_connect() {
    // `connect` reads this process's environment; the test sets none of the MPS knobs, so the
    // identity is ours with no client limits.
    let daemon = Daemon::start();
    let client = client::connect(&daemon.pipe).unwrap();
    assert_eq!(daemon.ask(&format!("get_client_list {}", client.server_pid)), format!("{}\n", std::process::id()));
}

#[test]
fn terminate_client_ends_that_client_only() {
    let daemon = Daemon::start();
    let a = daemon.client(900_011, 0);
    let b = daemon.client(900_012, 0);
    let server = a.server_pid;
    assert_eq!(daemon.ask(&format!("terminate_client {server} 900011")), "");
    assert_eq!(a.wait_fault_timeout(LONG), Some(Lost::Terminated));
    assert_eq!(b.wait_fault_timeout(SHORT), None);
    drop(a);
    wait_until("the terminated client to go", || daemon.ask(&format!("get_client_list {server}")) == "900012\n");
}

#[test]
fn killing_the_daemon_closes_the_clients_connections() {
    let mut daemon = Daemon::start();
    let client = daemon.client(900_021, 0);
    let server = client.server_pid;
    daemon.kill(libc::SIGKILL);
    assert_eq!(client.wait_fault_timeout(LONG), Some(Lost::Closed));
    wait_until("the server to die with its daemon", || !alive(server));
    // A new client now finds no daemon (the stale socket stays), and a new daemon starts at once.
    assert!(matches!(client::connect_with(&daemon.pipe, &hello(1, None, None)), Err(Error::NoDaemon { .. })));
    daemon.launch();
    assert_ne!(daemon.client(900_022, 0).server_pid, server);
}

#[test]
fn no_daemon_is_an_error_the_worker_can_tell() {
    let daemon = Daemon::unstarted(&[]);
    match client::connect_with(&daemon.pipe, &hello(1, None, None)) {
        Err(e @ Error::NoDaemon { .. }) => assert!(e.to_string().contains("no MPS control daemon"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn fake_fault_ends_the_clients_and_the_server_recovers() {
    let daemon = Daemon::start();
    let a = daemon.client(900_031, 0);
    let b = daemon.client(900_032, 0);
    let server = a.server_pid;
    assert_eq!(daemon.ask(&format!("fake_fault {server}")), "");
    assert!(matches!(a.wait_fault_timeout(LONG), Some(Lost::Fault(_))));
    assert!(matches!(b.wait_fault_timeout(LONG), Some(Lost::Fault(_))));
    // FAULT until the faulted clients have exited.
    assert_eq!(daemon.ask(&format!("get_server_status {server}")), "FAULT\n");
    drop(a);
    assert_eq!(daemon.ask(&format!("get_server_status {server}")), "FAULT\n");
    drop(b);
    wait_until("ACTIVE again", || daemon.ask(&format!("get_server_status {server}")) == "ACTIVE\n");
    let c = daemon.client(900_033, 0);
    assert_eq!(c.server_pid, server, "the same server serves again");
    assert_eq!(c.wait_fault_timeout(SHORT), None);
}

#[test]
fn a_second_user_waits_until_the_first_users_clients_are_gone() {
    let daemon = Daemon::start();
    let first = daemon.client(900_041, 0);
    let s1 = first.server_pid;
    let (tx, rx) = std::sync::mpsc::channel();
    let pipe = daemon.pipe.clone();
    std::thread::spawn(move || {
        let other = Hello { pid: 900_042, uid: 1000, active_thread_pct: None, pinned_limits: None };
        let _ = tx.send(client::connect_with(&pipe, &other));
    });
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "the other user's client is pending");
    wait_until("the pending line", || daemon.control_log().contains("NEW CLIENT 900042 from user 1000"));
    assert_eq!(daemon.server_list(), [s1]);
    // Same-user clients still join the running server meanwhile.
    let again = daemon.client(900_043, 0);
    assert_eq!(again.server_pid, s1);
    drop(first);
    assert!(rx.recv_timeout(SHORT).is_err(), "still a client of user 0");
    drop(again);
    let second = rx.recv_timeout(LONG).expect("served once user 0's clients are gone").unwrap();
    let s2 = second.server_pid;
    assert_ne!(s2, s1);
    wait_until("the first server to exit", || !alive(s1));
    assert_eq!(daemon.server_list(), [s2]);
    assert!(daemon.control_log().contains(&format!("Starting new server {s2} for user 1000")));
    if nix::unistd::geteuid().is_root() {
        let status = std::fs::read_to_string(format!("/proc/{s2}/status")).unwrap();
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert_eq!(uid_line.split_whitespace().nth(1), Some("1000"), "the server runs as its user");
    }
}

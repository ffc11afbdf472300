//! One thread per connection on the daemon's sockets. The first line says who is calling (see
//! [`crate::wire`]): a command interface gets replies until it hangs up; a client is handed to
//! the state and then watched until its connection closes, which is how the daemon learns that a
//! client process exited.

use super::Shutdown;
use super::command::{self, Command};
use super::execute::execute;
use super::state::Shared;
use crate::wire::{self, Hello};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::mpsc::Sender;

pub fn handle(shared: Arc<Shared>, stream: UnixStream, shutdown: Sender<Shutdown>) {
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    if first.trim() == wire::UI_HELLO {
        ui_session(&shared, reader, stream, &shutdown);
    } else if let Some(hello) = Hello::parse(&first) {
        client_session(&shared, reader, stream, hello);
    } else {
        shared.log("User did not send valid credentials");
    }
}

fn ui_session(
    shared: &Arc<Shared>,
    mut reader: BufReader<UnixStream>,
    mut stream: UnixStream,
    shutdown: &Sender<Shutdown>,
) {
    shared.log("NEW UI");
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        shared.log(&format!("Cmd:{text}"));
        let command = command::parse(text);
        if command == Command::Quit {
            // The main thread tears down, answers this UI, and exits the process.
            let _ = shutdown.send(Shutdown::Quit(stream));
            return;
        }
        let reply = execute(shared, &mut shared.lock(), command);
        for reply_line in reply.lines() {
            shared.log(reply_line);
        }
        if wire::write_reply(&mut stream, &reply).is_err() {
            break;
        }
    }
    shared.log("UI closed");
}

fn client_session(shared: &Arc<Shared>, mut reader: BufReader<UnixStream>, stream: UnixStream, hello: Hello) {
    let id = shared.lock().add_client(shared, hello, stream);
    // Clients send nothing after hello; end of file (or an error) means the process is gone.
    let mut sink = [0u8; 256];
    while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    shared.lock().remove_client(shared, id);
}

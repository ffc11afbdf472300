//! `GET /healthz` on 127.0.0.1, for the agent's health checks: 200 with `ok`, 404 for anything
//! else. One thread, one request per connection; enough for probes.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// Binds (port 0: any free port) and prints `listening 127.0.0.1:PORT`.
pub fn serve(port: u16) {
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => crate::exit::fail(&format!("cannot listen on 127.0.0.1:{port}: {e}")),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
    println!("listening 127.0.0.1:{port}");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = answer(stream);
        }
    });
}

fn answer(stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(&stream);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // Skip the headers up to the blank line.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut words = request.split_whitespace();
    let (status, body) = match (words.next(), words.next()) {
        (Some("GET"), Some("/healthz")) => ("200 OK", "ok\n"),
        _ => ("404 Not Found", "not found\n"),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    (&stream).write_all(response.as_bytes())
}

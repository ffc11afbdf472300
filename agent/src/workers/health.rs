//! Health checks of workers: an HTTP GET that must answer 2xx, or a TCP connection that must open,
//! each within its timeout.

use crate::reconcile::HealthSpec;
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One probe; the error says what failed.
pub async fn probe(spec: &HealthSpec) -> Result<(), String> {
    let check = async {
        if let Some(addr) = &spec.tcp {
            TcpStream::connect(addr).await.map(drop).map_err(|e| format!("tcp {addr}: {e}"))
        } else if let Some(url) = &spec.http {
            http_get(url).await
        } else {
            Ok(())
        }
    };
    match tokio::time::timeout(spec.timeout, check).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {} ms", spec.timeout.as_millis())),
    }
}

async fn http_get(url: &str) -> Result<(), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let host = uri.host().ok_or_else(|| format!("{url}: no host"))?.to_string();
    let port = uri.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((host.as_str(), port)).await.map_err(|e| format!("{url}: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("{url}: {e}"))?;
    tokio::spawn(conn);
    let path = uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, format!("{host}:{port}"))
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("{url}: {e}"))?;
    let response = sender.send_request(request).await.map_err(|e| format!("{url}: {e}"))?;
    if response.status().is_success() { Ok(()) } else { Err(format!("{url}: answered {}", response.status())) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spec(http: Option<String>, tcp: Option<String>) -> HealthSpec {
        HealthSpec {
            http,
            tcp,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            failure_threshold: 3,
            start_timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn probes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let ok = String::from_utf8_lossy(&buf[..n]).starts_with("GET /healthz ");
                let status = if ok { "200 OK" } else { "503 Service Unavailable" };
                let _ = s.write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes()).await;
            }
        });
        assert_eq!(probe(&spec(Some(format!("http://127.0.0.1:{port}/healthz")), None)).await, Ok(()));
        let bad = probe(&spec(Some(format!("http://127.0.0.1:{port}/other")), None)).await.unwrap_err();
        assert!(bad.contains("503"), "{bad}");
        assert_eq!(probe(&spec(None, Some(format!("127.0.0.1:{port}")))).await, Ok(()));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        assert!(probe(&spec(None, Some(format!("127.0.0.1:{closed}")))).await.is_err());
    }
}

//! The CRL distribution point of the revocation fixtures (`fixtures/notation-revocation`): a
//! minimal HTTP/1.1 server on the address their signed certificates name, answering every
//! request with the CRL it holds at that moment, or 503 when it holds none.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinHandle;

/// Where the fixtures' certificates say their CRL is: fixed, since it is inside the signatures.
pub const CRL_ADDR: &str = "127.0.0.1:39517";

/// What the server answers: a CRL's bytes, or `None` for 503. Change it while the server runs.
pub type ServedCrl = Arc<Mutex<Option<Vec<u8>>>>;

/// Starts the server on [`CRL_ADDR`]; aborting the handle stops it (the port then refuses
/// connections). Panics when the port is taken: the fixtures cannot name another.
pub async fn crl_server(served: ServedCrl) -> JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(CRL_ADDR)
        .await
        .expect("the CRL port 127.0.0.1:39517 (named in the fixtures' certificates) must be free");
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            let body = served.lock().unwrap_or_else(|e| e.into_inner()).clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let (status, body) = match body {
                    Some(b) => ("200 OK", b),
                    None => ("503 Service Unavailable", Vec::new()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/pkix-crl\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(&body).await;
            });
        }
    })
}

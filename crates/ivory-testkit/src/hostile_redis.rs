//! `HostileRedis`: a fake Redis on 127.0.0.1 that answers every command with an attack on its
//! client's memory (a huge announced bulk string or array, endless nesting, a line that never
//! ends, a reply dripped slowly) and counts what the client did: connections opened, closed,
//! and bytes it accepted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::error::{Result, io};

/// What every reply is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisAttack {
    /// `$2000000000\r\n`, then bytes as fast as the client takes them.
    HugeBulk,
    /// `*2000000000\r\n`, then `+x\r\n` elements as fast as the client takes them.
    HugeArray,
    /// `*1\r\n` forever: an array in an array in an array…
    DeepNesting,
    /// `+` and then bytes that never end the line.
    EndlessLine,
    /// A small bulk string (`$64\r\n`) whose bytes come one every 20 ms.
    Drip,
}

impl RedisAttack {
    /// Every attack.
    pub const ALL: [Self; 5] = [
        Self::HugeBulk,
        Self::HugeArray,
        Self::DeepNesting,
        Self::EndlessLine,
        Self::Drip,
    ];
}

/// Most bytes sent on one connection: far more than any bounded client buffers, small enough
/// that a client reading it all (the bug being tested) does not take the test machine down.
pub const HOSTILE_REDIS_CAP: u64 = 1024 * 1024 * 1024;

#[derive(Default)]
struct Counts {
    accepted: AtomicU64,
    closed: AtomicU64,
    sent: AtomicU64,
}

/// A running fake Redis; dropping it stops accepting (connections already open end when their
/// client closes them or the cap is reached).
pub struct HostileRedis {
    port: u16,
    counts: Arc<Counts>,
    accept: JoinHandle<()>,
}

impl HostileRedis {
    /// Listens on a free 127.0.0.1 port; every command on every connection gets `attack`.
    pub async fn start(attack: RedisAttack) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(io("binding the hostile redis"))?;
        let port = listener
            .local_addr()
            .map_err(io("hostile redis address"))?
            .port();
        let counts = Arc::new(Counts::default());
        let shared = Arc::clone(&counts);
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                let counts = Arc::clone(&shared);
                tokio::spawn(async move {
                    serve(stream, attack, &counts).await;
                    counts.closed.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        Ok(Self {
            port,
            counts,
            accept,
        })
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.counts.accepted.load(Ordering::Relaxed)
    }

    /// Connections that ended: the client closed it (a write failed or it read EOF) or the cap
    /// was reached.
    pub fn closed(&self) -> u64 {
        self.counts.closed.load(Ordering::Relaxed)
    }

    /// Bytes the client's side accepted (its buffers and the kernel's), over all connections.
    pub fn sent(&self) -> u64 {
        self.counts.sent.load(Ordering::Relaxed)
    }
}

impl Drop for HostileRedis {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Waits for a first command, then attacks until the client goes away or the cap.
async fn serve(mut stream: TcpStream, attack: RedisAttack, counts: &Counts) {
    let mut request = [0u8; 4096];
    match stream.read(&mut request).await {
        Ok(n) if n > 0 => {}
        _ => return,
    }
    let (head, body): (&[u8], Vec<u8>) = match attack {
        RedisAttack::HugeBulk => (b"$2000000000\r\n", vec![b'x'; 64 * 1024]),
        RedisAttack::HugeArray => (b"*2000000000\r\n", b"+x\r\n".repeat(16 * 1024)),
        RedisAttack::DeepNesting => (b"", b"*1\r\n".repeat(16 * 1024)),
        RedisAttack::EndlessLine => (b"+", vec![b'x'; 64 * 1024]),
        RedisAttack::Drip => (b"$64\r\n", vec![b'x']),
    };
    if send(&mut stream, head, counts).await.is_err() {
        return;
    }
    let mut total = 0u64;
    while total < HOSTILE_REDIS_CAP {
        if attack == RedisAttack::Drip {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Reading whatever the client sends keeps its writes from blocking; EOF ends it.
        let mut sink = [0u8; 1024];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::ZERO, stream.read(&mut sink)).await {
            return;
        }
        if send(&mut stream, &body, counts).await.is_err() {
            return;
        }
        total += body.len() as u64;
    }
}

async fn send(stream: &mut TcpStream, bytes: &[u8], counts: &Counts) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    counts.sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(())
}

//! [`RedisL2`]: the Redis side of the shared cache. Every call is bounded by
//! [`L2Config::deadline`], skipped while the breaker is open, and reads as "nothing" on any
//! failure; what it reads is bounded by [`L2Config::max_entry_bytes`] and must open under the
//! active HMAC keys.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::{BoxFuture, FutureExt as _};
use ivory_verify::{Lookup, SharedCache};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, Pipeline};
use tokio::time::Instant;

use crate::Error;
use crate::breaker::Breaker;
use crate::entry::{Keys, Rejected, SEAL_OVERHEAD, lease_token};

/// Deletes the lease only if this replica still holds it (its token), so a release after the
/// lease expired and another replica took it does not free theirs.
const RELEASE_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// The value, or else the lease, in one atomic step: a value stored between a separate read and
/// lease would otherwise be loaded again. Returns `{entry, 0}` (found), `{'', 1}` (lease
/// taken) or `{'', 2}` (lease held by another replica).
const LOOKUP_SCRIPT: &str = "local v = redis.call('GETRANGE', KEYS[1], 0, ARGV[3]) \
if #v > 0 then return {v, 0} end \
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'', 1} end \
return {'', 2}";

/// Settings of the L2.
#[derive(Debug)]
pub struct L2Config {
    /// `redis://[user:password@]host:port[/db]` or `rediss://…` (TLS, rustls).
    pub url: String,
    /// HMAC keys: the first seals, all open.
    pub keys: Keys,
    /// Longest one L2 call may take; past it the call counts as failed and the breaker opens.
    pub deadline: Duration,
    /// How long the L2 is skipped after a failed call.
    pub cooldown: Duration,
    /// Lifetime of a fill lease: how long the other replicas wait for a holder that vanished.
    pub lease_ttl: Duration,
    /// How often a waiting replica looks for the lease holder's value.
    pub poll_interval: Duration,
    /// Largest entry read; a larger one is rejected without being read whole.
    pub max_entry_bytes: usize,
}

impl L2Config {
    /// Defaults around `url` and `keys`.
    pub fn new(url: impl Into<String>, keys: Keys) -> Self {
        Self {
            url: url.into(),
            keys,
            deadline: Duration::from_millis(50),
            cooldown: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(5),
            poll_interval: Duration::from_millis(10),
            max_entry_bytes: 1024 * 1024,
        }
    }
}

/// Counters of the L2 (monotonic), for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct L2Stats {
    /// Reads answered by an authentic entry.
    pub hits: u64,
    /// Reads that found nothing (or an expired entry).
    pub misses: u64,
    /// Calls that failed or passed their deadline.
    pub errors: u64,
    /// Calls skipped because the breaker was open.
    pub skipped: u64,
    /// Entries ignored because they did not verify (HMAC, name, size or format).
    pub rejected: u64,
    /// Leases taken by this replica (it loaded for the fleet).
    pub leases_won: u64,
    /// Leases held by another replica (this one waited).
    pub leases_waited: u64,
    /// Waits that ended with the holder's value.
    pub waits_answered: u64,
    /// Calls made to the store (for the mean latency).
    pub calls: u64,
    /// Total time of those calls, microseconds.
    pub call_micros: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    rejected: AtomicU64,
    leases_won: AtomicU64,
    leases_waited: AtomicU64,
    waits_answered: AtomicU64,
    calls: AtomicU64,
    call_micros: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The shared cache on a Redis-compatible server. Cheap to share behind an `Arc`.
pub struct RedisL2 {
    conn: ConnectionManager,
    config: L2Config,
    breaker: Breaker,
    counters: Counters,
    /// Tokens of the leases this replica holds, by lease name.
    leases: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for RedisL2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisL2")
            .field("deadline", &self.config.deadline)
            .finish_non_exhaustive()
    }
}

impl RedisL2 {
    /// An L2 on `config.url`. Connects lazily (on the first call, then reconnects by itself):
    /// a store that is down at start-up delays nothing.
    pub fn new(config: L2Config) -> Result<Self, Error> {
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| Error::Url(format!("{:?}", e.kind())))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.deadline))
            .set_response_timeout(Some(config.deadline))
            .set_number_of_retries(1)
            .set_max_delay(config.cooldown);
        let conn = client
            .get_connection_manager_lazy(manager_config)
            .map_err(|e| Error::Url(e.to_string()))?;
        Ok(Self {
            conn,
            breaker: Breaker::new(config.cooldown),
            config,
            counters: Counters::default(),
            leases: Mutex::default(),
        })
    }

    /// Opens the connection ahead of the first lookup (`PING`, bounded by `limit`), so that
    /// the first admissions do not pay for connecting within the per-call deadline. False when
    /// the store did not answer: the L2 then connects on first use as usual.
    pub async fn connect(&self, limit: Duration) -> bool {
        let mut conn = self.conn.clone();
        let ping = redis::cmd("PING");
        matches!(
            tokio::time::timeout(limit, ping.query_async::<String>(&mut conn)).await,
            Ok(Ok(_))
        )
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> L2Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        L2Stats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            errors: get(&c.errors),
            skipped: get(&c.skipped),
            rejected: get(&c.rejected),
            leases_won: get(&c.leases_won),
            leases_waited: get(&c.leases_waited),
            waits_answered: get(&c.waits_answered),
            calls: get(&c.calls),
            call_micros: get(&c.call_micros),
        }
    }

    /// One command or pipeline, bounded by the deadline and the breaker; `None` on any failure.
    async fn query<T: FromRedisValue>(&self, request: Request) -> Option<T> {
        let start = Instant::now();
        if !self.breaker.allows(start.into_std()) {
            bump(&self.counters.skipped);
            return None;
        }
        let mut conn = self.conn.clone();
        let call = async {
            match &request {
                Request::Cmd(cmd) => cmd.query_async::<T>(&mut conn).await,
                Request::Pipe(pipe) => pipe.query_async::<T>(&mut conn).await,
            }
        };
        let outcome = tokio::time::timeout(self.config.deadline, call).await;
        let elapsed = start.elapsed();
        bump(&self.counters.calls);
        self.counters.call_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        match outcome {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.failed(&format!("{e}"));
                None
            }
            Err(_) => {
                self.failed("deadline passed");
                None
            }
        }
    }

    fn failed(&self, why: &str) {
        bump(&self.counters.errors);
        let now = std::time::Instant::now();
        if !self.breaker.is_open(now) {
            tracing::warn!(
                error = why,
                cooldown_ms = self.config.cooldown.as_millis() as u64,
                "L2 cache call failed; skipping the L2 for the cool-down"
            );
        }
        self.breaker.failed(now);
    }

    /// The bounded read of one name: at most `max_entry_bytes + 1` bytes come back.
    fn read_cmd(&self, name: &str) -> Cmd {
        let mut cmd = redis::cmd("GETRANGE");
        cmd.arg(name).arg(0).arg(self.max_index());
        cmd
    }

    fn max_index(&self) -> u64 {
        self.config.max_entry_bytes as u64
    }

    /// The value of a stored entry, or `None` (counted) when absent, expired or not authentic.
    fn open(&self, name: &str, entry: &[u8]) -> Option<Vec<u8>> {
        if entry.is_empty() {
            bump(&self.counters.misses);
            return None;
        }
        if entry.len() > self.config.max_entry_bytes {
            return self.reject(name, Rejected::Malformed);
        }
        match self.config.keys.open(name, entry, unix_ms()) {
            Ok(value) => {
                bump(&self.counters.hits);
                Some(value.to_vec())
            }
            Err(Rejected::Expired) => {
                bump(&self.counters.misses);
                None
            }
            Err(why) => self.reject(name, why),
        }
    }

    fn reject(&self, name: &str, why: Rejected) -> Option<Vec<u8>> {
        bump(&self.counters.rejected);
        tracing::warn!(name, reason = ?why, "L2 entry ignored: it does not verify");
        None
    }

    fn lease_name(name: &str) -> String {
        format!("{name}:lease")
    }

    fn take_token(&self, lease: &str) -> Option<String> {
        self.leases
            .lock()
            .ok()
            .and_then(|mut leases| leases.remove(lease))
    }

    fn release_cmd(lease: &str, token: &str) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RELEASE_SCRIPT).arg(1).arg(lease).arg(token);
        cmd
    }

    async fn get_inner(&self, name: &str) -> Option<Vec<u8>> {
        let entry: Vec<u8> = self.query(Request::Cmd(self.read_cmd(name))).await?;
        self.open(name, &entry)
    }

    async fn put_inner(&self, name: &str, value: Vec<u8>, ttl: Duration) {
        let lease = Self::lease_name(name);
        let token = self.take_token(&lease);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        // A value whose sealed entry a reader would refuse as too large is not stored.
        let too_large = value.len() > self.config.max_entry_bytes.saturating_sub(SEAL_OVERHEAD);
        if ttl_ms == 0 || too_large {
            if let Some(token) = token {
                let _: Option<redis::Value> = self
                    .query(Request::Cmd(Self::release_cmd(&lease, &token)))
                    .await;
            }
            return;
        }
        let entry = self
            .config
            .keys
            .seal(name, &value, unix_ms().saturating_add(ttl_ms));
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(name)
            .arg(entry)
            .arg("PX")
            .arg(ttl_ms)
            .ignore();
        if let Some(token) = token {
            pipe.add_command(Self::release_cmd(&lease, &token)).ignore();
        }
        let _: Option<()> = self.query(Request::Pipe(pipe)).await;
    }

    async fn lookup_inner(&self, name: &str) -> Lookup {
        let lease = Self::lease_name(name);
        let token = lease_token();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(LOOKUP_SCRIPT)
            .arg(2)
            .arg(name)
            .arg(&lease)
            .arg(&token)
            .arg(u64::try_from(self.config.lease_ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(self.max_index());
        match self.query::<(Vec<u8>, u8)>(Request::Cmd(cmd)).await {
            None => {
                self.release_orphan(lease, token);
                Lookup::Alone
            }
            Some((entry, 0)) => match self.open(name, &entry) {
                Some(value) => Lookup::Found(value),
                None => Lookup::Alone,
            },
            Some((_, 1)) => {
                bump(&self.counters.misses);
                bump(&self.counters.leases_won);
                if let Ok(mut leases) = self.leases.lock() {
                    leases.insert(lease, token);
                }
                Lookup::Won
            }
            Some(_) => {
                bump(&self.counters.misses);
                bump(&self.counters.leases_waited);
                Lookup::Held
            }
        }
    }

    /// A lookup that failed or passed its deadline may still run later (a paused server runs
    /// what it queued when it resumes) and take a lease this replica never learns about, which
    /// would keep the others waiting for the lease's lifetime. The release, sent now on the
    /// same connection, runs right after it and frees the lease (only if it holds this token).
    fn release_orphan(&self, lease: String, token: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut conn = self.conn.clone();
        let limit = self.config.lease_ttl;
        runtime.spawn(async move {
            let cmd = Self::release_cmd(&lease, &token);
            let _ = tokio::time::timeout(limit, cmd.query_async::<redis::Value>(&mut conn)).await;
        });
    }

    async fn wait_inner(&self, name: &str, until: Instant) -> Option<Vec<u8>> {
        let lease = Self::lease_name(name);
        loop {
            // Atomic: a holder's value and lease release never fall between the two reads.
            let mut pipe = redis::pipe();
            pipe.atomic()
                .add_command(self.read_cmd(name))
                .cmd("EXISTS")
                .arg(&lease);
            let (entry, held): (Vec<u8>, bool) = self.query(Request::Pipe(pipe)).await?;
            if !entry.is_empty() {
                let value = self.open(name, &entry);
                if value.is_some() {
                    bump(&self.counters.waits_answered);
                }
                return value;
            }
            if !held || Instant::now() + self.config.poll_interval >= until {
                return None;
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    async fn release_inner(&self, name: &str) {
        let lease = Self::lease_name(name);
        if let Some(token) = self.take_token(&lease) {
            let _: Option<redis::Value> = self
                .query(Request::Cmd(Self::release_cmd(&lease, &token)))
                .await;
        }
    }
}

enum Request {
    Cmd(Cmd),
    Pipe(Pipeline),
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl SharedCache for RedisL2 {
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<Vec<u8>>> {
        self.get_inner(name).boxed()
    }

    fn put<'a>(&'a self, name: &'a str, value: Vec<u8>, ttl: Duration) -> BoxFuture<'a, ()> {
        self.put_inner(name, value, ttl).boxed()
    }

    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Lookup> {
        self.lookup_inner(name).boxed()
    }

    fn wait<'a>(&'a self, name: &'a str, until: Instant) -> BoxFuture<'a, Option<Vec<u8>>> {
        self.wait_inner(name, until).boxed()
    }

    fn release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()> {
        self.release_inner(name).boxed()
    }

    fn keyed_hash(&self, secret: &[u8]) -> [u8; 32] {
        self.config.keys.keyed_hash(secret)
    }
}

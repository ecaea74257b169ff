//! [`RedisL2`]: the Redis side of the shared cache. Every call is bounded by
//! [`L2Config::deadline`], skipped while the breaker is open, and reads as "nothing" on any
//! failure; what it reads is bounded by [`L2Config::max_entry_bytes`] and must open under the
//! active HMAC keys.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use futures::future::{BoxFuture, FutureExt as _};
use ivory_verify::{Lookup, SharedCache};
use tokio::time::Instant;

use crate::Error;
use crate::breaker::Breaker;
use crate::client::{CallError, ORPHAN_SEND_LIMIT, Pool, Target};
use crate::entry::{Keys, Rejected, SEAL_OVERHEAD, lease_token};
use crate::resp::{Limits, Reply, command};

/// Deletes the lease only if this replica still holds it (its sealed value), so a release
/// after the lease expired and another replica took it does not free theirs.
const RELEASE_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// The value, or else the lease, in one atomic step: a value stored between a separate read and
/// lease would otherwise be loaded again. Returns `{entry, 0, ''}` (found), `{'', 1, ''}`
/// (lease taken) or `{'', 2, lease}` (lease held: its value, bounded, for the caller to check
/// that it is a lease a replica sealed and not one planted to make the fleet wait).
const LOOKUP_SCRIPT: &str = "local v = redis.call('GETRANGE', KEYS[1], 0, ARGV[3]) \
if #v > 0 then return {v, 0, ''} end \
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'', 1, ''} end \
return {'', 2, redis.call('GETRANGE', KEYS[2], 0, ARGV[4])}";

/// The value and the lease's value (both bounded) in one atomic step: a holder's value and
/// lease release never fall between the two reads.
const WAIT_SCRIPT: &str = "return {redis.call('GETRANGE', KEYS[1], 0, ARGV[1]), \
redis.call('GETRANGE', KEYS[2], 0, ARGV[2])}";

/// Largest lease value read; a sealed lease takes `SEAL_OVERHEAD` + a 32-character token.
const MAX_LEASE_BYTES: u64 = 255;
/// Reply bytes besides the entry itself: framing, the status and a lease value.
const REPLY_OVERHEAD: usize = 1024;
/// Clock difference between replicas tolerated on a lease's sealed expiry.
const LEASE_SKEW: Duration = Duration::from_millis(500);

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
    /// Largest entry read; a larger one is rejected without being read whole. Also bounds
    /// every reply the store may send (this plus a small overhead).
    pub max_entry_bytes: usize,
    /// PEM certificates trusted for a `rediss://` server besides the system roots (a private
    /// CA).
    pub ca_pem: Option<Vec<u8>>,
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
            ca_pem: None,
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
    pool: Pool,
    config: L2Config,
    breaker: Breaker,
    counters: Counters,
    /// Sealed values of the leases this replica holds, by lease name.
    leases: Mutex<HashMap<String, Vec<u8>>>,
}

impl std::fmt::Debug for RedisL2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisL2")
            .field("deadline", &self.config.deadline)
            .finish_non_exhaustive()
    }
}

/// What a call returns: one reply per command, or nothing (counted, breaker opened).
type Replies = Option<Vec<Reply>>;

impl RedisL2 {
    /// An L2 on `config.url`. Connects lazily (on the first call, and again after a failed
    /// one): a store that is down at start-up delays nothing.
    pub fn new(config: L2Config) -> Result<Self, Error> {
        let target = Target::parse(&config.url, config.ca_pem.as_deref())?;
        let limits = Limits {
            max_bulk: config.max_entry_bytes.saturating_add(1),
            max_array: 4,
            max_depth: 2,
            max_total: config
                .max_entry_bytes
                .saturating_add(1)
                .saturating_add(REPLY_OVERHEAD),
        };
        Ok(Self {
            pool: Pool::new(target, limits),
            breaker: Breaker::new(config.cooldown),
            config,
            counters: Counters::default(),
            leases: Mutex::default(),
        })
    }

    /// Opens a connection ahead of the first lookup (`PING`, bounded by `limit`), so that
    /// the first admissions do not pay for connecting within the per-call deadline. False when
    /// the store did not answer: the L2 then connects on first use as usual.
    pub async fn connect(&self, limit: Duration) -> bool {
        let ping = async {
            let mut conn = self.pool.get().await?;
            let replies = conn
                .call(&[command(&[b"PING"])], self.pool.limits())
                .await?;
            self.pool.put(conn);
            Ok::<_, CallError>(replies)
        };
        matches!(
            tokio::time::timeout(limit, ping).await,
            Ok(Ok(replies)) if matches!(replies.as_slice(), [Reply::Simple(pong)] if pong == b"PONG")
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

    /// `commands` on one connection, bounded by the deadline (connecting included) and the
    /// breaker; `None` on any failure, and the connection is then dropped. `after_failure`
    /// is written behind the commands on that connection when the call failed after sending
    /// them (see [`RedisL2::lookup_inner`]).
    async fn query(&self, commands: &[Vec<u8>], after_failure: Option<Vec<u8>>) -> Replies {
        let start = ivory_clock::now();
        if !self.breaker.allows(start) {
            bump(&self.counters.skipped);
            return None;
        }
        let deadline = start + self.config.deadline;
        let outcome = match tokio::time::timeout_at(deadline, self.pool.get()).await {
            Err(_) => Err("deadline passed while connecting".to_owned()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(mut conn)) => {
                match tokio::time::timeout_at(deadline, conn.call(commands, self.pool.limits()))
                    .await
                {
                    Ok(Ok(replies)) => {
                        self.pool.put(conn);
                        Ok(replies)
                    }
                    failed => {
                        let why = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => "deadline passed".to_owned(),
                        };
                        // Never read again: a reply still coming is left unread.
                        match (after_failure, tokio::runtime::Handle::try_current()) {
                            (Some(cmd), Ok(runtime)) => {
                                runtime.spawn(tokio::time::timeout(
                                    ORPHAN_SEND_LIMIT,
                                    conn.send_after(cmd),
                                ));
                            }
                            _ => drop(conn),
                        }
                        Err(why)
                    }
                }
            }
        };
        let elapsed = start.elapsed();
        bump(&self.counters.calls);
        self.counters.call_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        match outcome {
            Ok(replies) => Some(replies),
            Err(why) => {
                // The idle connections are as suspect as the failed one (a restarted or
                // hostile server): the next call starts afresh.
                self.pool.clear();
                self.failed(&why);
                None
            }
        }
    }

    fn failed(&self, why: &str) {
        bump(&self.counters.errors);
        let now = ivory_clock::now();
        if !self.breaker.is_open(now) {
            tracing::warn!(
                error = why,
                cooldown_ms = self.config.cooldown.as_millis() as u64,
                "L2 cache call failed; skipping the L2 for the cool-down"
            );
        }
        self.breaker.failed(now);
    }

    fn max_index(&self) -> String {
        self.config.max_entry_bytes.to_string()
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

    /// Whether a lease value read from the store is worth waiting for: sealed by a replica for
    /// this lease, not past its sealed expiry, and not expiring further away than a lease
    /// lives. A planted lease (no key), one moved from another name, or an old one replayed
    /// fails, so it costs a waiter at most one poll.
    fn lease_is_live(&self, lease: &str, value: &[u8]) -> bool {
        let now = unix_ms();
        match self.config.keys.open_with_expiry(lease, value, now) {
            Ok((_, expires)) => {
                let longest = self.config.lease_ttl.saturating_add(LEASE_SKEW);
                expires
                    <= now.saturating_add(u64::try_from(longest.as_millis()).unwrap_or(u64::MAX))
            }
            // Expired: its holder vanished; load without waiting.
            Err(Rejected::Expired) => false,
            Err(why) => {
                bump(&self.counters.rejected);
                tracing::warn!(lease, reason = ?why, "L2 lease ignored: it does not verify");
                false
            }
        }
    }

    fn lease_name(name: &str) -> String {
        format!("{name}:lease")
    }

    fn take_lease(&self, lease: &str) -> Option<Vec<u8>> {
        self.leases
            .lock()
            .ok()
            .and_then(|mut leases| leases.remove(lease))
    }

    fn release_cmd(lease: &str, sealed: &[u8]) -> Vec<u8> {
        command(&[
            b"EVAL",
            RELEASE_SCRIPT.as_bytes(),
            b"1",
            lease.as_bytes(),
            sealed,
        ])
    }

    fn read_cmd(&self, name: &str) -> Vec<u8> {
        command(&[
            b"GETRANGE",
            name.as_bytes(),
            b"0",
            self.max_index().as_bytes(),
        ])
    }

    async fn get_inner(&self, name: &str) -> Option<Vec<u8>> {
        let replies = self.query(&[self.read_cmd(name)], None).await?;
        match replies.as_slice() {
            [Reply::Bulk(Some(entry))] => self.open(name, entry),
            [Reply::Bulk(None)] => self.open(name, &[]),
            _ => self.unexpected(),
        }
    }

    /// A reply of the wrong shape: the store is not behaving as Redis; counted as a failure.
    fn unexpected<T>(&self) -> Option<T> {
        self.pool.clear();
        self.failed("unexpected reply shape");
        None
    }

    async fn put_inner(&self, name: &str, value: Vec<u8>, ttl: Duration) {
        let lease = Self::lease_name(name);
        let held = self.take_lease(&lease);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        // A value whose sealed entry a reader would refuse as too large is not stored.
        let too_large = value.len() > self.config.max_entry_bytes.saturating_sub(SEAL_OVERHEAD);
        let mut commands = Vec::with_capacity(2);
        if ttl_ms > 0 && !too_large {
            let entry = self
                .config
                .keys
                .seal(name, &value, unix_ms().saturating_add(ttl_ms));
            commands.push(command(&[
                b"SET",
                name.as_bytes(),
                &entry,
                b"PX",
                ttl_ms.to_string().as_bytes(),
            ]));
        }
        if let Some(sealed) = held {
            commands.push(Self::release_cmd(&lease, &sealed));
        }
        if !commands.is_empty() {
            let _ = self.query(&commands, None).await;
        }
    }

    async fn lookup_inner(&self, name: &str) -> Lookup {
        let lease = Self::lease_name(name);
        let ttl_ms = u64::try_from(self.config.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        let sealed = self.config.keys.seal(
            &lease,
            lease_token().as_bytes(),
            unix_ms().saturating_add(ttl_ms),
        );
        let cmd = command(&[
            b"EVAL",
            LOOKUP_SCRIPT.as_bytes(),
            b"2",
            name.as_bytes(),
            lease.as_bytes(),
            &sealed,
            ttl_ms.to_string().as_bytes(),
            self.max_index().as_bytes(),
            MAX_LEASE_BYTES.to_string().as_bytes(),
        ]);
        // A lookup that failed or passed its deadline may still run later (a paused server
        // runs what it queued when it resumes) and take a lease this replica never learns
        // about, which would keep the others waiting. The release, written right behind it on
        // the same connection, runs right after it and frees the lease (only this value).
        let release = Self::release_cmd(&lease, &sealed);
        let Some(replies) = self.query(&[cmd], Some(release)).await else {
            return Lookup::Alone;
        };
        let [Reply::Array(Some(parts))] = replies.as_slice() else {
            return self.unexpected().unwrap_or(Lookup::Alone);
        };
        match parts.as_slice() {
            [Reply::Bulk(Some(entry)), Reply::Integer(0), _] => match self.open(name, entry) {
                Some(value) => Lookup::Found(value),
                None => Lookup::Alone,
            },
            [_, Reply::Integer(1), _] => {
                bump(&self.counters.misses);
                bump(&self.counters.leases_won);
                if let Ok(mut leases) = self.leases.lock() {
                    leases.insert(lease, sealed);
                }
                Lookup::Won
            }
            [_, Reply::Integer(2), Reply::Bulk(Some(held))] => {
                bump(&self.counters.misses);
                if self.lease_is_live(&lease, held) {
                    bump(&self.counters.leases_waited);
                    Lookup::Held
                } else {
                    Lookup::Alone
                }
            }
            _ => self.unexpected().unwrap_or(Lookup::Alone),
        }
    }

    async fn wait_inner(&self, name: &str, until: Instant) -> Option<Vec<u8>> {
        let lease = Self::lease_name(name);
        // No holder needs longer than a lease lives to fill a name.
        let until = until.min(ivory_clock::now() + self.config.lease_ttl);
        let cmd = command(&[
            b"EVAL",
            WAIT_SCRIPT.as_bytes(),
            b"2",
            name.as_bytes(),
            lease.as_bytes(),
            self.max_index().as_bytes(),
            MAX_LEASE_BYTES.to_string().as_bytes(),
        ]);
        loop {
            let replies = self.query(std::slice::from_ref(&cmd), None).await?;
            let [Reply::Array(Some(parts))] = replies.as_slice() else {
                return self.unexpected();
            };
            let [Reply::Bulk(Some(entry)), Reply::Bulk(Some(held))] = parts.as_slice() else {
                return self.unexpected();
            };
            if !entry.is_empty() {
                let value = self.open(name, entry);
                if value.is_some() {
                    bump(&self.counters.waits_answered);
                }
                return value;
            }
            if held.is_empty()
                || !self.lease_is_live(&lease, held)
                || ivory_clock::now() + self.config.poll_interval >= until
            {
                return None;
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    async fn release_inner(&self, name: &str) {
        let lease = Self::lease_name(name);
        if let Some(sealed) = self.take_lease(&lease) {
            let _ = self
                .query(&[Self::release_cmd(&lease, &sealed)], None)
                .await;
        }
    }
}

fn unix_ms() -> u64 {
    ivory_clock::wall()
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

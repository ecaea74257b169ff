//! ivory-l2: the cache the replicas of an ivory fleet share (L2), on Redis or any server that
//! speaks its protocol (Valkey is the drop-in equivalent).
//!
//! [`RedisL2`] implements `ivory_verify::SharedCache`; the verifier decides what is shared
//! (verdicts, resolved tags, signature source hints) and this crate how:
//!
//! * **Tamper-evident** (`entry`): every value is sealed with an HMAC bound to its name and
//!   lifetime under a key shared by the replicas; an entry that does not open is ignored and
//!   counted (`rejected`), so write access to Redis alone cannot make an image "verified".
//! * **Fleet-wide coalescing**: a miss takes a short lease (`SET NX PX`) whose value is sealed
//!   like an entry; the other replicas poll for the holder's value instead of asking the
//!   registry, but only while the lease opens under the keys and lives no longer than a lease
//!   does, so a lease planted in Redis costs them at most one poll.
//! * **Never a dependency of admission**: each call has its own small deadline, reads are
//!   bounded in size, and a failed or late call opens a circuit breaker (`breaker`) for a
//!   cool-down during which the L2 is skipped. Every failure reads as "not in the L2".
//!
//! [`DiskCache`] puts the same entries in files, for the one-shot commands' persistent cache
//! (`ivory verify|apply|audit --cache-dir`): sealed with a per-user key, bounded in size.
//!
//! The client is this crate's own (`client`, [`resp`]): RESP2 over tokio TCP or tokio-rustls
//! (`rediss://`, system roots plus an optional private CA), a pool of at most 8 connections,
//! each call "write the commands, read exactly their replies" under the deadline. Replies go
//! through a bounded incremental parser ([`resp::parse`]) that refuses any bulk string, array,
//! nesting or total size beyond what the largest legitimate reply needs (an entry plus a
//! little) *before* allocating it, and a connection that failed in any way is dropped unread.
//! `redis` (redis-rs), used before, multiplexes calls over one connection that goes on reading
//! a reply after its caller's deadline, into memory and with no bound on the size announced:
//! a hostile server (or anyone on a plain `redis://` path) grew replicas by gigabytes. Its
//! buffering cannot be bounded from outside, and the handful of single-key commands and
//! scripts used here make a focused client small.

mod breaker;
mod client;
pub mod disk;
mod entry;
pub mod resp;
mod store;

pub use disk::{DiskCache, DiskError, DiskStats};
pub use entry::{Keys, MIN_KEY_BYTES, Rejected};
pub use store::{L2Config, L2Stats, RedisL2};

/// Why the L2 could not be set up (its keys or its URL). Once running, the L2 has no errors
/// to report: every failure reads as "not in the L2" and is counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A key shorter than [`MIN_KEY_BYTES`].
    #[error("{what}: an L2 HMAC key must be at least {MIN_KEY_BYTES} bytes, got {len}")]
    KeyTooShort {
        /// Where the key came from.
        what: String,
        /// Its length.
        len: usize,
    },
    /// No key, or more than two.
    #[error("the L2 needs one HMAC key (two while rotating), got {0}")]
    KeyCount(usize),
    /// The URL is not a Redis URL (the detail never repeats the URL, which may hold a password).
    #[error(
        "--cache-redis: not a Redis URL (redis://host:port[/db] or rediss://host:port[/db]): {0}"
    )]
    Url(String),
    /// The CA given for `rediss://` is not usable.
    #[error("--cache-redis-ca: {0}")]
    Ca(String),
}

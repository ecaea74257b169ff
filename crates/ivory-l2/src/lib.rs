//! ivory-l2: the cache the replicas of an ivory fleet share (L2), on Redis or any server that
//! speaks its protocol (Valkey is the drop-in equivalent), and the one-shot commands' persistent
//! cache on files.
//!
//! [`RedisL2`] (`ivory serve --cache-redis URL --cache-redis-key FILE`) and [`DiskCache`]
//! implement [`ivory_verify::SharedCache`]. The verifier decides what is shared (verdicts,
//! resolved tags, signature source hints) and under which name (ivory-verify's
//! `verifier/shared.rs`); this crate only how, and knows nothing of verification:
//!
//! * **Tamper-evident** (`entry`, [`Keys`]): every value is sealed with an HMAC bound to its name
//!   and lifetime under a key shared by the replicas (two keys while rotating); an entry that
//!   does not open is ignored and counted (`rejected`), so write access to Redis alone cannot
//!   make an image "verified" (`docs/SECURITY.md`, credentials and caches).
//! * **Fleet-wide coalescing**: a replica's miss runs one Lua script that returns the value or
//!   takes a lease (`SET lease NX PX`, 5 s) whose value is a random token sealed like an entry,
//!   bound to the lease's name and an expiry of now + 5 s. A replica that finds the lease held
//!   gets its value back from the same script and waits only for a lease that opens, is not
//!   past its sealed expiry and expires no further than 5 s (+ 0.5 s clock skew) away; it then
//!   polls every 10 ms (one script returning the value and the lease's value) for at most half
//!   of its remaining budget and at most the lease's 5 s, and stops as soon as the lease is gone
//!   or no longer passes those checks. A lease planted by someone with write access to Redis,
//!   moved from another name or replayed after its expiry therefore costs a replica at most one
//!   poll. A holder whose load fails releases the lease (a script deleting it only if it still
//!   holds this replica's sealed value), so the others load at once.
//! * **Never a dependency of admission**: every call, connecting included, is bounded by
//!   `--cache-redis-timeout` (50 ms, [`L2Config`]) and reads as "not there" on any failure; a
//!   failure opens a circuit breaker (`breaker`) for a second, during which the L2 is skipped.
//!   A lookup that timed out may still run when a paused server resumes; its lease is released
//!   by a release written right behind it on the same connection, which is then closed unread.
//!   Start-up connects with a 2 s limit and serves without the L2 if it does not answer. Reads
//!   are bounded in size by the scripts themselves (`GETRANGE`), and every outcome is counted
//!   ([`L2Stats`]).
//!
//! The client is this crate's own (`client`, [`resp`]): RESP2 over tokio TCP or tokio-rustls
//! (`rediss://`, the system roots plus an optional `--cache-redis-ca`; `AUTH` and `SELECT` from
//! the URL), a pool of at most 8 lazily opened connections, each call "write the commands, read
//! exactly their replies" under the deadline. Replies go through [`resp::parse`], a pure
//! function over the bytes received so far ("need more", a reply, or an error) that checks
//! every bulk length (1 MiB + 1), array length (4), nesting depth (2) and total (1 MiB + 1 KiB:
//! a whole entry plus a lease value) before allocating anything ([`resp::Limits`]), and accepts
//! only canonical RESP2. A connection whose call passed its deadline, broke a limit or the
//! protocol, got an error reply or an extra byte is dropped unread, the idle ones with it; an
//! idle connection the server closed meanwhile is skipped before use. A hostile server can so
//! make a replica hold at most 8 × 1 MiB of reply bytes, whatever it announces or streams (the
//! `resp_reply` fuzz target; the binary's `memory::a_hostile_redis_cannot_grow_ivory_memory`
//! test). `redis` (redis-rs), used before, multiplexes calls over one connection that goes on
//! reading a reply after its caller's deadline, into memory and with no bound on the size
//! announced: a hostile server (or anyone on a plain `redis://` path) grew replicas by
//! gigabytes. Its buffering cannot be bounded from outside, and the handful of single-key
//! commands and scripts used here make a focused client small. Hand-written under the rule in
//! docs/ARCHITECTURE.md; oracle: `tests/redis.rs`, where redis-rs (a dev-dependency) reads and
//! plants what this client wrote
//! (`entries_round_trip_and_anything_not_sealed_for_its_name_is_ignored_and_counted`).
//!
//! # The persistent cache of the one-shot commands
//!
//! `ivory verify`, `apply`, `audit` and `test` put [`DiskCache`] ([`disk`]) behind the verifier's
//! in-process caches through the same seam (`--cache-dir`, default `$XDG_CACHE_HOME/ivory` or
//! `~/.cache/ivory`; `--no-cache`; `--cache-max-size`, [`disk::DEFAULT_MAX_BYTES`]). What is
//! stored, under which name and for how long is exactly what the fleet shares, so a second run
//! over the same images asks the registry nothing while those lifetimes last (BENCHMARKS.md,
//! "Persistent CLI cache"). There is no fleet to coordinate with: a miss loads alone (a lookup
//! answers [`ivory_verify::Lookup::Alone`], never a lease). Each entry is one file named by the
//! SHA-256 of its name, in the L2's sealed format under a per-user key (`key`, 0600) made on
//! first use. The folder, `entries` and `key` are opened once without following links and
//! trusted only when `fstat` of the handle shows them owned by the user (or root) and writable
//! by no one else; every entry operation is then `openat`/`renameat`/`unlinkat` relative to the
//! `entries` handle (rustix). Files are written to a temporary name and renamed, read with a
//! size cap, and deleted when they do not open or have expired; past the size bound the oldest
//! (by modification time) go until a quarter of the bound is free. `ivory serve` does not use
//! it: its caches live in memory and, across replicas, in the L2.

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

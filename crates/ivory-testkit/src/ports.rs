//! Loopback ports for servers the harness spawns (docker-registry, redis-server), which can only
//! be told a port number, not handed a bound socket.
//!
//! A port from `bind(:0)` comes from the kernel's ephemeral range, the same range every outgoing
//! connection and every other `:0` listener of the test run draws from, so between releasing it
//! and the child binding it, someone else can take it (CI saw exactly that: "bind: address
//! already in use"). Ports here come from below the ephemeral range, are never handed out twice
//! by one process, and are checked to be bindable; callers still retry on a lost race
//! ([`is_port_taken`]) since another process may pick the same port.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::UNIX_EPOCH;

use crate::error::{Error, Result};

/// Lowest port handed out: above the well-known and most registered service ports.
const FLOOR: u16 = 20_000;
/// Used when `/proc/sys/net/ipv4/ip_local_port_range` cannot be read (Linux's default start).
const DEFAULT_EPHEMERAL_START: u16 = 32_768;
/// Candidates tried before giving up.
const CANDIDATES: u32 = 512;
/// How often a caller restarts its server on a fresh port after losing the race for one.
pub(crate) const START_ATTEMPTS: usize = 4;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port nothing listens on now, outside the kernel's ephemeral range and not handed
/// out before by this process.
pub fn free_port() -> Result<u16> {
    let top = ephemeral_start().max(FLOOR + 1_000);
    let span = u32::from(top - FLOOR);
    let mut state = seed();
    for _ in 0..CANDIDATES {
        state = xorshift(state);
        let offset = u16::try_from(state % u64::from(span)).unwrap_or(0);
        let port = FLOOR + offset;
        if claim(port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::Startup(format!(
        "no free loopback port in {FLOOR}..{top} after {CANDIDATES} tries"
    )))
}

/// Whether a server's startup error says its port was taken (retry on a fresh port).
pub fn is_port_taken(error: &Error) -> bool {
    // Go says "address already in use", redis "Address already in use".
    let text = error.to_string().to_ascii_lowercase();
    text.contains("address already in use")
}

fn claim(port: u16) -> bool {
    let mut guard = HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    guard.get_or_insert_with(HashSet::new).insert(port)
}

fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_START)
}

/// Differs between processes and between calls, so parallel test binaries spread out.
fn seed() -> u64 {
    let nanos = ivory_clock::wall()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ (u64::from(std::process::id()) << 32)) | 1
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let start = ephemeral_start();
        // Each port is bound the moment it is handed out and held. The servers other tests of
        // this binary start at the same time draw from the same range, and a port can be lost
        // to one of them between the check inside `free_port` and this bind (seen twice in 20
        // runs; never with this test alone): the race the module's callers retry on. A picker
        // that handed out busy ports would fail most of these binds, not one or two.
        let mut held = Vec::new();
        let mut lost = Vec::new();
        for _ in 0..50 {
            let port = free_port().unwrap();
            assert!((FLOOR..start.max(FLOOR + 1_000)).contains(&port), "{port}");
            match TcpListener::bind(("127.0.0.1", port)) {
                Ok(listener) => held.push((port, listener)),
                Err(e) => lost.push((port, e.kind())),
            }
        }
        assert!(
            lost.len() <= 2,
            "ports not bindable when handed out: {lost:?}"
        );
        let distinct: HashSet<u16> = held.iter().map(|(port, _)| *port).collect();
        assert_eq!(distinct.len(), held.len());
    }

    #[test]
    fn a_taken_port_is_recognised_in_a_startup_error() {
        let go = Error::Startup(
            "docker-registry exited: listen tcp 127.0.0.1:42813: bind: address already in use"
                .into(),
        );
        let redis = Error::Startup(
            "Could not create server TCP listening socket *:6379: bind: Address already in use"
                .into(),
        );
        assert!(is_port_taken(&go));
        assert!(is_port_taken(&redis));
        assert!(!is_port_taken(&Error::Startup("no answer on /v2/".into())));
    }
}

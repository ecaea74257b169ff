//! The L2 against a hostile Redis (ivory-testkit's `HostileRedis`, a fake on 127.0.0.1): every
//! reply announces gigabytes, nests without end, never ends its line or drips. Each call must
//! fail within its deadline, its connection must be closed (the fake sees it end) and the next
//! call must open a fresh one, and this process's peak memory must not follow what the fake
//! sends.

// Test helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ivory_l2::{Keys, L2Config, RedisL2};
use ivory_testkit::{HostileRedis, RedisAttack, eventually};
use ivory_verify::{Lookup, SharedCache};

const KEY: &[u8] = b"fleet-key-A-0123456789abcdef0123456789";
const DEADLINE: Duration = Duration::from_millis(300);
/// Bound on this process's peak RSS growth over one attack (the reply limit is 1 MiB + 1 KiB).
const PEAK_BOUND_KIB: u64 = 32 * 1024;
/// Bound on the bytes the fake could hand over before the client hung up: kernel socket
/// buffers and one reply limit.
const SENT_BOUND: u64 = 64 * 1024 * 1024;

fn kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Resets the peak RSS (`VmHWM`) to the current RSS (Linux `clear_refs` 5).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

fn l2(url: String) -> RedisL2 {
    let keys = Keys::new(&[("test key".to_owned(), KEY.to_vec())]).unwrap();
    let mut config = L2Config::new(url, keys);
    config.deadline = DEADLINE;
    // The breaker would skip the second call; what is checked here is the connection.
    config.cooldown = Duration::from_millis(1);
    RedisL2::new(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_replies_fail_within_the_deadline_drop_the_connection_and_cost_no_memory() {
    let mut figures = Vec::new();
    for attack in RedisAttack::ALL {
        let fake = HostileRedis::start(attack).await.unwrap();
        let l2 = l2(fake.url());
        reset_peak();
        let base = kib("VmRSS:");

        let start = ivory_clock::now();
        assert_eq!(l2.get("n").await, None, "{attack:?}");
        let took = start.elapsed();
        assert!(
            took < DEADLINE + Duration::from_millis(400),
            "{attack:?}: {took:?}"
        );
        assert_eq!((l2.stats().errors, l2.stats().hits), (1, 0), "{attack:?}");
        assert!(
            eventually(
                "the connection to be closed",
                Duration::from_secs(5),
                || async { fake.closed() == 1 }
            )
            .await
            .is_ok(),
            "{attack:?}: the connection was kept ({} sent)",
            fake.sent()
        );

        // The next call (a lookup, which also writes a release behind itself) opens a fresh
        // connection, fails the same way, and closes it too.
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(l2.lookup("n").await, Lookup::Alone, "{attack:?}");
        assert_eq!(fake.accepted(), 2, "{attack:?}");
        assert!(
            eventually(
                "the second connection to be closed",
                Duration::from_secs(5),
                || async { fake.closed() == 2 }
            )
            .await
            .is_ok(),
            "{attack:?}: the second connection was kept"
        );
        assert_eq!(l2.stats().errors, 2, "{attack:?}");

        // The fake would go on sending for seconds to anyone still reading.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sent = fake.sent();
        let grown = kib("VmHWM:").saturating_sub(base);
        figures.push(format!(
            "{attack:?}: first call {took:?}, fake sent {sent} B, peak RSS +{grown} KiB"
        ));
        assert!(sent < SENT_BOUND, "{attack:?}: {sent} bytes taken");
        assert!(grown < PEAK_BOUND_KIB, "{attack:?}: peak RSS +{grown} KiB");
    }
    eprintln!("{}", figures.join("\n"));
}

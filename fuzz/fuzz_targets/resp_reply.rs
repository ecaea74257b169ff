//! The RESP2 reply parser of the shared L2 cache (`ivory_l2::resp::parse`): what a Redis
//! server, or anyone in its place, sends a replica.
//!
//! Input: four bytes choosing the limits (bulk length, array length, depth, total bytes),
//! then the bytes received. Checked properties: never a panic; the memory allocated while
//! parsing stays within a small multiple of the bytes the parser may look at (at most
//! `max_total`), whatever the input announces; "need more" only below `max_total` bytes; an
//! accepted reply keeps every limit, re-encodes (`resp::encode`) to exactly the bytes it
//! consumed, parses the same from those bytes alone, and one byte fewer needs more.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use ivory_l2::resp::{Limits, Parsed, Reply, encode, parse};
use libfuzzer_sys::fuzz_target;

/// Bytes allocated now and the most since the last reset: the allocation bound is measured,
/// not inferred from the code.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let now = CURRENT.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                - layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        } else {
            CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes of heap a reply of `n` input bytes may take: each node (32 bytes) takes at least 3
/// input bytes, and data is copied once.
const BYTES_PER_INPUT_BYTE: usize = 16;

fn within(reply: &Reply, limits: &Limits, depth: usize) -> bool {
    depth <= limits.max_depth
        && match reply {
            Reply::Bulk(Some(data)) => data.len() <= limits.max_bulk,
            Reply::Array(Some(items)) => {
                items.len() <= limits.max_array
                    && items.iter().all(|i| within(i, limits, depth + 1))
            }
            _ => true,
        }
}

fuzz_target!(|data: &[u8]| {
    let Some((head, buf)) = data.split_first_chunk::<4>() else {
        return;
    };
    let limits = Limits {
        max_bulk: usize::from(head[0]) * 16,
        max_array: usize::from(head[1] % 16),
        max_depth: usize::from(head[2] % 6),
        max_total: 8 + usize::from(head[3]) * 64,
    };
    let seen = buf.len().min(limits.max_total);
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let parsed = parse(buf, &limits);
    let grown = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        grown <= BYTES_PER_INPUT_BYTE * seen + 256,
        "{grown} bytes allocated for {seen} bytes looked at"
    );
    match parsed {
        Err(_) => {}
        Ok(Parsed::NeedMore) => assert!(buf.len() < limits.max_total),
        Ok(Parsed::Reply(reply, used)) => {
            assert!(used <= buf.len() && used <= limits.max_total);
            assert!(within(&reply, &limits, 1), "{reply:?} breaks {limits:?}");
            assert_eq!(encode(&reply), &buf[..used]);
            assert_eq!(
                parse(&buf[..used], &limits),
                Ok(Parsed::Reply(reply, used))
            );
            assert_eq!(parse(&buf[..used - 1], &limits), Ok(Parsed::NeedMore));
        }
    }
});

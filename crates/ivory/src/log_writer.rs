//! `ivory serve`'s log writer: each formatted line is appended to a bounded buffer, and one
//! thread writes out every waiting line in one write. While admissions run, lines are gathered
//! and written every [`QUIET_WAIT`] (or once [`WAKE_BYTES`] wait); when the last admission in
//! flight ends, the server says so ([`BatchedLog::activity`]) and they are written at once, as is
//! every line logged while no admission runs (start-up, reloads, background scans). A flush
//! that comes within [`BUSY_GAP`] of the previous one finds the thread looking for flushes by
//! itself every [`BUSY_GAP`] instead of being woken: a server whose admissions end one after
//! another (each one at a time) would otherwise wake it once per admission. So a quiet server
//! logs as it goes, and a busy one writes many lines per system call and wakes this thread at
//! most every [`BUSY_GAP`].
//!
//! A log consumer that stalls (a full pipe, a slow collector) must not stall admissions, so a
//! line that does not fit is dropped and counted (`ivory_log_lines_dropped_total`). A server
//! writes several lines per admission: tracing-appender's channel made its writer thread spin,
//! yield and write once per line, and waking a thread per line or per admission cost as much
//! (BENCHMARKS.md, issue 27's second round).
//!
//! Hand-written (the rule in docs/ARCHITECTURE.md), replacing tracing-appender's
//! `non_blocking`: measured in BENCHMARKS.md ("The log line": about 600 fewer instructions a
//! line, no receiver spinning), and bounded by bytes as well as lines. Oracle: ivory-bench's
//! `log_line_oracle::ivory_writes_the_lines_the_stock_layer_and_appender_write` (the same lines
//! through both writers).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tracing_subscriber::fmt::MakeWriter;

/// Longest a line waits for the writer thread while admissions run.
const QUIET_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// Waiting bytes that wake the writer thread before then.
const WAKE_BYTES: usize = 256 * 1024;
/// How long after a flush the writer thread looks for the next one by itself. 5 ms, not 1: the
/// thread's own wake-ups cost 2.7 µs of kernel time per admission at 1 ms and 1.0 µs at 5 ms
/// (BENCHMARKS.md, issue 47); a busy server's lines wait at most this long, and [`WAKE_BYTES`]
/// still wakes the thread first when they pile up.
const BUSY_GAP: std::time::Duration = std::time::Duration::from_millis(5);
/// How long stopping waits for the last lines to be written: a consumer that stalls must not
/// keep the process from exiting.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The bounds of what may wait for the log consumer before lines are dropped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// Lines.
    pub(crate) lines: usize,
    /// Bytes.
    pub(crate) bytes: usize,
}

/// The writer thread; dropping this writes out what is buffered and stops it, waiting at most
/// [`STOP_WAIT`].
pub(crate) struct BatchedLog {
    shared: Arc<Shared>,
    /// Closed by the writer thread when it has written everything and stopped.
    stopped: std::sync::mpsc::Receiver<()>,
}

/// What tracing writes formatted lines to ([`MakeWriter`]).
#[derive(Clone)]
pub(crate) struct LogSink {
    shared: Arc<Shared>,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    dropped: AtomicU64,
    bounds: Bounds,
    /// Admissions are running: lines are batched rather than written at once.
    running: AtomicBool,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    lines: usize,
    /// The lines waiting are to be written at once.
    urgent: bool,
    /// The writer thread looks for flushes by itself (a flush came within [`BUSY_GAP`]).
    polling: bool,
    closed: bool,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        // Nothing panics while holding the lock; a poisoned buffer is still a buffer.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn append(&self, line: &[u8]) {
        let mut pending = self.pending();
        let fits = pending.lines < self.bounds.lines
            && pending.bytes.len().saturating_add(line.len()) <= self.bounds.bytes;
        if !fits {
            drop(pending);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        pending.bytes.extend_from_slice(line);
        pending.lines += 1;
        let due = pending.bytes.len() >= WAKE_BYTES || !self.running.load(Ordering::Relaxed);
        self.flush_if(pending, due);
    }

    /// Has the waiting lines written at once when `due`: wakes the writer thread unless it is
    /// looking for flushes by itself, or was already asked.
    fn flush_if(&self, mut pending: MutexGuard<'_, Pending>, due: bool) {
        let flush = due && !pending.urgent && !pending.bytes.is_empty();
        pending.urgent |= flush;
        let wake = flush && !pending.polling;
        drop(pending);
        if wake {
            self.wake.notify_one();
        }
    }
}

impl BatchedLog {
    /// Starts the writer thread writing to `out`; lines beyond `bounds` are dropped.
    pub(crate) fn start(
        out: impl Write + Send + 'static,
        bounds: Bounds,
    ) -> std::io::Result<(Self, LogSink)> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
            bounds,
            running: AtomicBool::new(false),
        });
        let writer = Arc::clone(&shared);
        let (done, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("ivory-log".into())
            .spawn(move || {
                write_batches(&writer, out);
                drop(done);
            })?;
        let sink = LogSink {
            shared: Arc::clone(&shared),
        };
        Ok((Self { shared, stopped }, sink))
    }

    /// What the server tells when admissions start running (`true`: lines are batched from
    /// now on) and when the last one in flight ends (`false`: what waits is written at once, and
    /// so is every line until admissions run again).
    pub(crate) fn activity(&self) -> impl Fn(bool) + Send + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move |running| {
            shared.running.store(running, Ordering::Relaxed);
            if !running {
                shared.flush_if(shared.pending(), true);
            }
        }
    }

    /// A counter of the lines dropped so far.
    pub(crate) fn dropped(&self) -> impl Fn() -> u64 + Send + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move || shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for BatchedLog {
    fn drop(&mut self) {
        self.shared.pending().closed = true;
        self.shared.wake.notify_one();
        // Disconnected once the thread is done; a timeout leaves it to the process's exit.
        let _ = self.stopped.recv_timeout(STOP_WAIT);
    }
}

/// The writer thread: waits for a flush (or [`QUIET_WAIT`] with lines waiting), takes every
/// line waiting, writes them.
fn write_batches(shared: &Shared, mut out: impl Write) {
    let mut batch = Vec::new();
    loop {
        let closed = {
            let mut pending = shared.pending();
            if pending.polling {
                pending = shared
                    .wake
                    .wait_timeout(pending, BUSY_GAP)
                    .map(|(guard, _)| guard)
                    .unwrap_or_else(|p| p.into_inner().0);
                // No flush since the last look: back to being woken.
                pending.polling = pending.urgent;
            }
            while !pending.urgent && !pending.closed {
                let (guard, waited) = shared
                    .wake
                    .wait_timeout(pending, QUIET_WAIT)
                    .unwrap_or_else(|p| p.into_inner());
                pending = guard;
                if waited.timed_out() && !pending.bytes.is_empty() {
                    break;
                }
            }
            // After a flush, look for the next one by itself for a while.
            pending.polling = pending.urgent;
            std::mem::swap(&mut batch, &mut pending.bytes);
            pending.lines = 0;
            pending.urgent = false;
            pending.closed
        };
        if !batch.is_empty() {
            // Nowhere to report a failed log write; the next batch tries again.
            let _ = out.write_all(&batch).and_then(|()| out.flush());
            batch.clear();
        }
        if closed {
            return;
        }
    }
}

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = SinkRef<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        SinkRef(&self.shared)
    }
}

/// One event's writer: borrows the sink, so writing a line costs no reference count.
pub(crate) struct SinkRef<'a>(&'a Shared);

impl Write for SinkRef<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// An output that records what was written, and can be made to block.
    #[derive(Clone, Default)]
    struct Output {
        written: Arc<Mutex<Vec<u8>>>,
        gate: Arc<Mutex<()>>,
    }

    impl Write for Output {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _open = self
                .gate
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?;
            self.written
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn written(output: &Output) -> String {
        String::from_utf8(output.written.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn every_line_is_written_in_order_by_the_time_the_log_stops() {
        let output = Output::default();
        let bounds = Bounds {
            lines: 10_000,
            bytes: 1 << 20,
        };
        let (log, sink) = BatchedLog::start(output.clone(), bounds).unwrap();
        let expected: String = (0..5_000).map(|i| format!("line {i}\n")).collect();
        for line in expected.lines() {
            sink.make_writer()
                .write_all(format!("{line}\n").as_bytes())
                .unwrap();
        }
        let dropped = log.dropped();
        drop(log);
        assert_eq!(written(&output), expected);
        assert_eq!(dropped(), 0);
    }

    #[test]
    fn lines_are_written_without_waiting_for_the_log_to_stop() {
        let output = Output::default();
        let bounds = Bounds {
            lines: 10,
            bytes: 1 << 10,
        };
        let (log, sink) = BatchedLog::start(output.clone(), bounds).unwrap();
        sink.make_writer().write_all(b"soon\n").unwrap();
        let deadline = ivory_clock::now() + Duration::from_secs(10);
        while written(&output).is_empty() && ivory_clock::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(written(&output), "soon\n");
        drop(log);
    }

    #[test]
    fn lines_go_out_at_a_flush_or_on_their_own() {
        let output = Output::default();
        let bounds = Bounds {
            lines: 10,
            bytes: 1 << 10,
        };
        let (log, sink) = BatchedLog::start(output.clone(), bounds).unwrap();
        let activity = log.activity();
        activity(true);
        let flush = || activity(false);
        let wait_for = |lines: usize| {
            let deadline = ivory_clock::now() + Duration::from_secs(10);
            while written(&output).lines().count() < lines && ivory_clock::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            written(&output)
        };
        // Without a flush, a line logged while admissions run still goes out.
        sink.make_writer().write_all(b"result one\n").unwrap();
        assert_eq!(wait_for(1), "result one\n");
        sink.make_writer().write_all(b"result two\n").unwrap();
        sink.make_writer().write_all(b"admission\n").unwrap();
        flush();
        assert_eq!(wait_for(3), "result one\nresult two\nadmission\n");
        // A flush with nothing waiting changes nothing.
        flush();
        drop(log);
        assert_eq!(written(&output), "result one\nresult two\nadmission\n");
    }

    #[test]
    fn stopping_waits_for_a_stalled_output_only_so_long() {
        let output = Output::default();
        let stall = output.gate.lock().unwrap();
        let bounds = Bounds {
            lines: 10,
            bytes: 1 << 10,
        };
        let (log, sink) = BatchedLog::start(output.clone(), bounds).unwrap();
        sink.make_writer().write_all(b"never read\n").unwrap();
        let started = ivory_clock::now();
        drop(log);
        // A liveness bound, not a speed goal: the writer thread is still stuck in its write.
        assert!(ivory_clock::now() - started < Duration::from_secs(30));
        drop(stall);
    }

    #[test]
    fn a_stalled_output_drops_and_counts_what_does_not_fit_and_never_blocks_a_writer() {
        let output = Output::default();
        let stall = output.gate.lock().unwrap();
        let bounds = Bounds {
            lines: 100,
            bytes: 1 << 20,
        };
        let (log, sink) = BatchedLog::start(output.clone(), bounds).unwrap();
        let dropped = log.dropped();
        // The first batch may be taken (and block in the output) before the rest arrive.
        for i in 0..1_000 {
            sink.make_writer()
                .write_all(format!("line {i}\n").as_bytes())
                .unwrap();
        }
        assert!(dropped() >= 1_000 - 2 * 100, "{} dropped", dropped());
        drop(stall);
        drop(log);
        let lines = written(&output).lines().count() as u64;
        assert_eq!(lines + dropped(), 1_000);
    }
}

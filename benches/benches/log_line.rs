//! The log line of one admission, formatted and written both ways (`cargo bench -p ivory-bench
//! --bench log_line`): the binary's own (`crates/ivory/src/json_log.rs`'s one-pass format
//! through `crates/ivory/src/log_writer.rs`'s batching writer, both included here by path) and
//! the stock one (tracing-subscriber's `json()` layer through tracing-appender's
//! `non_blocking` writer), and ivory's format on tracing-appender (the writers alone), each to
//! `io::sink`, [`LINES`] lines of `ivory_server`'s admission
//! event per iteration. The writers' own threads are not in divan's time; callgrind counts
//! them (BENCHMARKS.md, "The log line"). With `LOG_LINE_ONCE=ivory|stock` the binary writes
//! `LOG_LINE_COUNT` lines (default [`LINES`]) once, waits for its writer and exits, for
//! `valgrind --tool=callgrind` (two counts apart give the instructions per line).

// Helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

use divan::Bencher;
use tracing::Dispatch;

#[path = "../../crates/ivory/src/json_log.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod json_log;
#[path = "../../crates/ivory/src/log_writer.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod log_writer;

/// Lines per iteration: a burst of admissions.
const LINES: usize = 1000;

/// The serve log's bounds (crates/ivory/src/main.rs).
const BOUNDS: log_writer::Bounds = log_writer::Bounds {
    lines: 8192,
    bytes: 16 << 20,
};

fn main() {
    let count = std::env::var("LOG_LINE_COUNT")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(LINES);
    match std::env::var("LOG_LINE_ONCE").as_deref() {
        Ok("ivory") => {
            let (log, dispatch) = ivory();
            let activity = log.activity();
            tracing::dispatcher::with_default(&dispatch, || {
                activity(true);
                lines(count);
                activity(false);
            });
            drop(log); // writes out what waits and joins the writer
        }
        Ok(stock_writer @ ("stock" | "ivory-format-on-appender")) => {
            let (guard, dispatch) = if stock_writer == "stock" {
                stock()
            } else {
                ivory_format_on_appender()
            };
            tracing::dispatcher::with_default(&dispatch, || lines(count));
            drop(guard); // flushes and joins the writer
        }
        _ => divan::main(),
    }
}

/// `ivory_server::routes::log_admission`'s event, with typical values.
#[inline(never)]
fn lines(count: usize) {
    for i in 0..count {
        tracing::info!(
            route = "/validate/ivpol/verify-images",
            uid = "8f2b8c1e-5f0e-4c36-9d43-2f1a7c5d9e01",
            kind = "Pod",
            namespace = "team-a",
            name = "web-7d9f8c6b5-x2k4q",
            operation = "CREATE",
            dry_run = false,
            outcome = "allowed",
            elapsed_ms = (i % 7) as u64,
            budget_ms = 9000u64,
            warnings = 0usize,
            denial = "",
            "admission"
        );
    }
}

fn ivory() -> (log_writer::BatchedLog, Dispatch) {
    let (log, sink) = log_writer::BatchedLog::start(std::io::sink(), BOUNDS).unwrap();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_current_span(false)
        .event_format(json_log::JsonLines::new())
        .with_writer(sink)
        .finish();
    (log, Dispatch::new(subscriber))
}

fn stock() -> (tracing_appender::non_blocking::WorkerGuard, Dispatch) {
    let (writer, guard) = tracing_appender::non_blocking(std::io::sink());
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_current_span(false)
        .with_span_list(false)
        .with_writer(writer)
        .finish();
    (guard, Dispatch::new(subscriber))
}

/// ivory's format through tracing-appender: the writers compared alone.
fn ivory_format_on_appender() -> (tracing_appender::non_blocking::WorkerGuard, Dispatch) {
    let (writer, guard) = tracing_appender::non_blocking(std::io::sink());
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_current_span(false)
        .event_format(json_log::JsonLines::new())
        .with_writer(writer)
        .finish();
    (guard, Dispatch::new(subscriber))
}

/// ivory's format and batching writer, as `ivory serve` sets them up.
#[divan::bench(sample_count = 20)]
fn ivory_format_and_writer(bencher: Bencher<'_, '_>) {
    let (log, dispatch) = ivory();
    let activity = log.activity();
    tracing::dispatcher::with_default(&dispatch, || {
        bencher.bench_local(|| {
            activity(true);
            lines(LINES);
            activity(false);
        });
    });
}

/// tracing-subscriber's JSON layer through tracing-appender's non-blocking writer.
#[divan::bench(sample_count = 20)]
fn stock_json_layer_and_appender(bencher: Bencher<'_, '_>) {
    let (_guard, dispatch) = stock();
    tracing::dispatcher::with_default(&dispatch, || bencher.bench_local(|| lines(LINES)));
}

/// ivory's format through tracing-appender's non-blocking writer.
#[divan::bench(sample_count = 20)]
fn ivory_format_on_appender_writer(bencher: Bencher<'_, '_>) {
    let (_guard, dispatch) = ivory_format_on_appender();
    tracing::dispatcher::with_default(&dispatch, || bencher.bench_local(|| lines(LINES)));
}

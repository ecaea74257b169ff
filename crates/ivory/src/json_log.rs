//! The JSON log line format, written in one pass into a reused buffer.
//!
//! The output is exactly tracing-subscriber's `json()` format without the current span
//! (`{"timestamp":…,"level":…,"fields":{…},"target":…}`, proven by the test below), except for
//! one field: [`LOG_MEMBERS_FIELD`], JSON object members ivory wrote itself (the policy-result
//! lines), goes into `fields` as it is where the stock format writes one escaped string. A server
//! writes one such line per admission and one per policy result, and the stock formatter spent
//! about a fifth of a warm admission on them (BENCHMARKS.md): it formats each value into a
//! temporary string and validates the UTF-8 of every fragment it writes. The line here is a
//! `String` from the start, so nothing is validated again (that was ~780 instructions a line,
//! issue 47), and values are written by ivory's JSON text writers, as serde_json writes them.
//! An event inside a span (ivory opens none; a dependency might) is handed to the stock
//! formatter, which also lists the spans.
//!
//! Hand-written (the rule in docs/ARCHITECTURE.md), replacing tracing-subscriber's `json()`
//! format: 6.1 k instructions a line against its 26.3 k (BENCHMARKS.md, "The log line").
//! Oracle: `tests::lines_are_those_of_the_stock_json_format` here, and ivory-bench's
//! `log_line_oracle::ivory_writes_the_lines_the_stock_layer_and_appender_write`.

use std::cell::RefCell;
use std::fmt::{self, Write as _};

use ivory_plumbing::json_text::{LOG_MEMBERS_FIELD, MembersLog, push_content, push_u64};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::time::SystemTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// Lines longer than this give their buffer back after being written.
const KEPT_BUFFER_BYTES: usize = 64 * 1024;

thread_local! {
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
    /// The second of the last timestamp written on this thread, and its text up to the `.`.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// tracing-subscriber's JSON event format, faster for events outside spans.
pub(crate) struct JsonLines {
    stock: Format<Json, SystemTime>,
}

impl JsonLines {
    /// The format `tracing_subscriber::fmt().json().with_current_span(false)` writes.
    pub(crate) fn new() -> Self {
        Self {
            stock: Format::default().json().with_current_span(false),
        }
    }
}

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let in_span = event.parent().is_some() || ctx.lookup_current().is_some();
        if in_span {
            return self.stock.format_event(ctx, writer, event);
        }
        LINE.with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                // A value's formatting logged (re-entered this thread's line): the stock way.
                return self.stock.format_event(ctx, writer.by_ref(), event);
            };
            line.clear();
            let result = write_line(&mut line, event).and_then(|()| writer.write_str(&line));
            if line.capacity() > KEPT_BUFFER_BYTES {
                *line = String::new();
            }
            result
        })
    }
}

/// Writes one event as a JSON line (with its newline) into `line`.
fn write_line(line: &mut String, event: &Event<'_>) -> fmt::Result {
    let meta = event.metadata();
    line_head(line, meta.level())?;
    let mut fields = Fields {
        line,
        first: true,
        failed: false,
    };
    event.record(&mut fields);
    if fields.failed {
        return Err(fmt::Error);
    }
    line_tail(line, meta.target())
}

/// `{"timestamp":"…","level":"…","fields":{`: a line up to its first field.
fn line_head(line: &mut String, level: &Level) -> fmt::Result {
    line.push_str("{\"timestamp\":\"");
    timestamp(line, ivory_clock::wall())?;
    line.push('"');
    line.push_str(",\"level\":");
    string(line, level.as_str())?;
    line.push_str(",\"fields\":{");
    Ok(())
}

/// `},"target":"…"}` and the newline: a line from its last field on.
fn line_tail(line: &mut String, target: &str) -> fmt::Result {
    line.push_str("},\"target\":");
    string(line, target)?;
    line.push_str("}\n");
    Ok(())
}

/// Writes lines of JSON members to the log's writer as [`JsonLines`] writes the tracing event
/// `info!(target: …, message = …, json_members = …)`, without the event
/// ([`MembersLog`]; the same bytes: `tests::members_lines_are_those_of_their_events`).
pub(crate) struct MembersLines<W> {
    writer: W,
}

impl<W> MembersLines<W> {
    /// Lines written to `writer`, the writer the tracing subscriber writes to.
    pub(crate) fn new(writer: W) -> Self {
        Self { writer }
    }
}

impl<W> MembersLog for MembersLines<W>
where
    W: for<'w> MakeWriter<'w> + Send + Sync,
{
    fn info(&self, target: &'static str, message: &'static str, members: &str) {
        LINE.with(|line| {
            let mut fresh = String::new();
            // Taken only by a line being formatted on this thread, which never calls here.
            let mut kept = line.try_borrow_mut();
            let line = match kept.as_deref_mut() {
                Ok(line) => line,
                Err(_) => &mut fresh,
            };
            line.clear();
            if members_line(line, target, message, members).is_ok() {
                // As the tracing subscriber does, a line the writer refuses is left unwritten.
                let _ = std::io::Write::write_all(&mut self.writer.make_writer(), line.as_bytes());
            }
            if line.capacity() > KEPT_BUFFER_BYTES {
                *line = String::new();
            }
        });
    }
}

/// One INFO line of `target`: `message`, then `members` as they are.
fn members_line(line: &mut String, target: &str, message: &str, members: &str) -> fmt::Result {
    line_head(line, &Level::INFO)?;
    line.push_str("\"message\":");
    string(line, message)?;
    if !members.is_empty() {
        line.push(',');
        line.push_str(members);
    }
    line_tail(line, target)
}

/// `now` as tracing-subscriber's [`SystemTime`] writes it (`2026-12-05T01:02:03.456789Z`): the
/// date and time of day are formatted once per second and thread, the microseconds each time.
fn timestamp(line: &mut String, now: std::time::SystemTime) -> fmt::Result {
    let since_epoch = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| fmt::Error)?;
    let seconds = since_epoch.as_secs();
    SECOND.with(|second| {
        let mut second = second.try_borrow_mut().map_err(|_| fmt::Error)?;
        if second.0 != seconds {
            let whole = std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds);
            let text = chrono::DateTime::<chrono::Utc>::from(whole)
                .format("%Y-%m-%dT%H:%M:%S.")
                .to_string();
            *second = (seconds, text);
        }
        line.push_str(&second.1);
        Ok(())
    })?;
    // Six digits by hand: `write!` with a width costs more than the rest of the timestamp.
    let mut micros = since_epoch.subsec_micros();
    let mut digits = [b'0'; 6];
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    for digit in digits {
        line.push(char::from(digit));
    }
    line.push('Z');
    Ok(())
}

/// A JSON string, escaped as serde_json escapes it.
fn string(line: &mut String, value: &str) -> fmt::Result {
    ivory_plumbing::json_text::push_string(line, value);
    Ok(())
}

/// The `fields` object: each field as tracing-serde records it.
struct Fields<'l> {
    line: &'l mut String,
    first: bool,
    failed: bool,
}

impl Fields<'_> {
    /// Writes `"name":` and then the value `write` appends.
    fn entry(&mut self, field: &Field, write: impl FnOnce(&mut String) -> fmt::Result) {
        if self.failed {
            return;
        }
        if !self.first {
            self.line.push(',');
        }
        self.first = false;
        let written = string(self.line, field.name()).and_then(|()| {
            self.line.push(':');
            write(self.line)
        });
        self.failed = written.is_err();
    }

    /// Writes `members`, JSON object members written by ivory (see [`LOG_MEMBERS_FIELD`]), as
    /// they are.
    fn members(&mut self, members: &str) {
        if self.failed || members.is_empty() {
            return;
        }
        if !self.first {
            self.line.push(',');
        }
        self.first = false;
        self.line.push_str(members);
    }

    /// Writes `"name":` and then `value` as it is (a JSON literal or number).
    fn literal(&mut self, field: &Field, value: &str) {
        self.entry(field, |line| {
            line.push_str(value);
            Ok(())
        });
    }
}

/// Escapes what is written to it into a JSON string's content, piece by piece, as serde_json's
/// `collect_str` escapes the whole.
struct Escaping<'l>(&'l mut String);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, piece: &str) -> fmt::Result {
        push_content(self.0, piece);
        Ok(())
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.entry(field, |line| {
            line.push('"');
            write!(Escaping(line), "{value:?}")?;
            line.push('"');
            Ok(())
        });
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == LOG_MEMBERS_FIELD {
            self.members(value);
            return;
        }
        self.entry(field, |line| string(line, value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.literal(field, if value { "true" } else { "false" });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |line| {
            push_u64(line, value);
            Ok(())
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |line| {
            if value < 0 {
                line.push('-');
            }
            push_u64(line, value.unsigned_abs());
            Ok(())
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // Rare in ivory's lines: serde_json's own text (shortest round trip, `null` when not
        // finite).
        match serde_json::to_string(&value) {
            Ok(text) => self.literal(field, &text),
            Err(_) => self.failed = true,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    pub(crate) struct Captured(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    impl Captured {
        /// The lines written, each with its timestamp replaced (the two formats run at
        /// different instants).
        pub(crate) fn lines(&self) -> Vec<serde_json::Value> {
            let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
            let text = String::from_utf8(bytes).unwrap_or_default();
            assert!(text.ends_with('\n'), "{text}");
            text.lines()
                .map(|l| {
                    let mut v: serde_json::Value =
                        serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
                    let stamp = v["timestamp"].as_str().unwrap_or_default().to_owned();
                    assert!(stamp.ends_with('Z') && stamp.len() >= 20, "{stamp}");
                    v["timestamp"] = "T".into();
                    v
                })
                .collect()
        }

        /// Each line's raw text after its timestamp (from `,"level"` on).
        fn raw_after_timestamps(&self) -> Vec<Option<String>> {
            let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8(bytes)
                .unwrap_or_default()
                .lines()
                .map(|l| l.split_once(",\"level\"").map(|(_, rest)| rest.to_owned()))
                .collect()
        }

        fn text_without_timestamps(&self) -> String {
            self.lines()
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        }
    }

    /// A JSON subscriber with this module's format, writing to `into`.
    pub(crate) fn fast_subscriber(into: &Captured) -> impl tracing::Subscriber + use<> {
        tracing_subscriber::fmt()
            .json()
            .with_current_span(false)
            .event_format(JsonLines::new())
            .with_writer(into.clone())
            .finish()
    }

    fn events() {
        let error = std::io::Error::other("disk \"full\"\n");
        tracing::info!(
            target: "ivory::audit",
            text = "quote \" backslash \\ tab \t é \u{1}",
            shown = %"display ✓",
            debugged = ?vec!["a", "b"],
            flag = true,
            unsigned = 18_446_744_073_709_551_615_u64,
            negative = -7_i64,
            least = i64::MIN,
            float = 0.25_f64,
            not_a_number = f64::NAN,
            escaped = ?"tab\t \u{7f} \u{1b} é \"q\"",
            error = &error as &(dyn std::error::Error + 'static),
            "policy result"
        );
        tracing::warn!(count = 3, "a message with {} and \"quotes\"", "args");
        // A dotted name, and a name given as a string that needs escaping.
        tracing::info!(log.kind = "dotted", "odd \"name\"\t" = 1, "names");
        tracing::error!("only a message");
    }

    #[test]
    fn lines_are_those_of_the_stock_json_format() {
        let fast = Captured::default();
        let subscriber = fast_subscriber(&fast);
        tracing::subscriber::with_default(subscriber, events);
        let stock = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(false)
            .with_writer(stock.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, events);
        assert_eq!(fast.lines().len(), 4);
        // Byte for byte once timestamps are equal: compare the raw texts too.
        assert_eq!(
            fast.text_without_timestamps(),
            stock.text_without_timestamps()
        );
        assert_eq!(fast.raw_after_timestamps(), stock.raw_after_timestamps());
    }

    /// A line of members written straight to the writer is the line of the tracing event the
    /// server would otherwise log: the same bytes once the timestamps are equal.
    #[test]
    fn members_lines_are_those_of_their_events() {
        let members = [
            r#""cause":"admission_request","uid":"u-\"1\"","images":"a,b""#,
            "",
        ];
        let direct = Captured::default();
        let lines = MembersLines::new(direct.clone());
        for m in members {
            lines.info("ivory::audit", "policy result", m);
            lines.info("ivory_server::routes", "admission \"quoted\"", m);
        }
        let through_tracing = Captured::default();
        tracing::subscriber::with_default(fast_subscriber(&through_tracing), || {
            for m in members {
                tracing::info!(
                    target: "ivory::audit",
                    message = "policy result",
                    json_members = m
                );
                tracing::info!(
                    target: "ivory_server::routes",
                    message = "admission \"quoted\"",
                    json_members = m
                );
            }
        });
        assert_eq!(direct.lines().len(), 4);
        assert_eq!(
            direct.text_without_timestamps(),
            through_tracing.text_without_timestamps()
        );
        assert_eq!(
            direct.raw_after_timestamps(),
            through_tracing.raw_after_timestamps()
        );
    }

    #[test]
    fn timestamps_are_written_as_the_stock_format_writes_them() {
        use tracing_subscriber::fmt::time::FormatTime as _;
        let at = |seconds: u64, micros: u32| {
            let mut line = String::new();
            let instant =
                std::time::UNIX_EPOCH + std::time::Duration::new(seconds, micros * 1_000 + 999);
            timestamp(&mut line, instant).unwrap();
            line
        };
        assert_eq!(at(1_796_000_000, 123_456), "2026-11-30T00:53:20.123456Z");
        // A leap day, and a second written again from the same thread's cache.
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(at(951_782_400, 999_999), "2000-02-29T00:00:00.999999Z");
        assert_eq!(at(1_796_000_000, 0), "2026-11-30T00:53:20.000000Z");
        // Against the stock format read at (almost) the same instant.
        let same_second = (0..3).any(|_| {
            let mut stock = String::new();
            SystemTime
                .format_time(&mut Writer::new(&mut stock))
                .unwrap();
            let mut ours = String::new();
            timestamp(&mut ours, ivory_clock::wall()).unwrap();
            stock.len() == ours.len() && stock[..20] == ours[..20]
        });
        assert!(same_second);
    }

    #[test]
    fn events_in_a_span_keep_the_stock_span_list() {
        let fast = Captured::default();
        let subscriber = fast_subscriber(&fast);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("request", id = 7);
            let _entered = span.enter();
            tracing::info!("inside");
        });
        let lines = fast.lines();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["spans"][0]["name"], "request");
        assert_eq!(lines[0]["fields"]["message"], "inside");
    }
}

//! JSON string literals written straight into text, escaped byte for byte as serde_json
//! escapes them, eight bytes at a time where nothing needs escaping.
//!
//! serde_json looks every byte of a string up in a table on its own, and on the warm path the
//! response, its `verified-images` annotation (JSON inside JSON, so escaped twice) and the log
//! lines are mostly long runs of plain text (BENCHMARKS.md, issue 27's third round). The
//! writers here are for that text only; everything else still goes through serde_json.

use std::cell::RefCell;
use std::sync::OnceLock;

/// Text that JSON can be appended to: a `String` or a byte buffer.
pub trait JsonOut {
    /// Appends `text` as it is.
    fn push_text(&mut self, text: &str);
    /// Makes room for `additional` more bytes.
    fn reserve_text(&mut self, additional: usize);
}

impl JsonOut for String {
    #[inline]
    fn push_text(&mut self, text: &str) {
        self.push_str(text);
    }

    #[inline]
    fn reserve_text(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

impl JsonOut for Vec<u8> {
    #[inline]
    fn push_text(&mut self, text: &str) {
        self.extend_from_slice(text.as_bytes());
    }

    #[inline]
    fn reserve_text(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

/// Appends `value` as a JSON string literal, quotes included: exactly what
/// `serde_json::to_string(value)` writes (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other
/// control characters as `\u00xx`, everything else as it is).
pub fn push_string(out: &mut impl JsonOut, value: &str) {
    out.reserve_text(value.len() + 2);
    out.push_text("\"");
    push_content(out, value);
    out.push_text("\"");
}

/// Appends `value` escaped as inside a JSON string literal, without the quotes: a string
/// written in pieces this way is escaped as [`push_string`] escapes it whole.
pub fn push_content(out: &mut impl JsonOut, value: &str) {
    match next_escape(value.as_bytes(), 0) {
        // Most strings (names, images, digests): one scan and one copy.
        None => out.push_text(value),
        Some(at) if REMEMBERED_LEN.contains(&value.len()) => push_remembered(out, value, at),
        Some(at) => push_escaped(out, value, at),
    }
}

/// Appends the JSON string literal of `parts` joined by `separator`: what [`push_string`]
/// writes for `parts.join(separator)`, without that string.
pub fn push_joined<'p>(
    out: &mut impl JsonOut,
    parts: impl IntoIterator<Item = &'p str>,
    separator: &str,
) {
    out.push_text("\"");
    for (i, part) in parts.into_iter().enumerate() {
        if i > 0 {
            push_content(out, separator);
        }
        push_content(out, part);
    }
    out.push_text("\"");
}

/// The name of a log field whose value is JSON object members already written (`"k":"v",…`,
/// escaped by this module): ivory's log format puts them into the line's `fields` as they are,
/// where the stock format would write one escaped string. For lines written many times per
/// request (the policy results), whose fields cost more to visit one by one than to write.
pub const LOG_MEMBERS_FIELD: &str = "json_members";

/// Writes lines of JSON members ([`LOG_MEMBERS_FIELD`]) itself: the binary's JSON log format,
/// which then writes them exactly as it writes such a tracing event (level INFO, the message
/// first, then the members), without the event's dispatch and field visits (~1.2 k instructions
/// a line, four lines an admission: BENCHMARKS.md, issue 47). The caller has asked tracing
/// whether INFO lines of its target are enabled; directives on spans or field values, which
/// ivory's lines do not use, are not asked.
pub trait MembersLog: Send + Sync {
    /// Writes one INFO line of `target` with `message` and `members`.
    fn info(&self, target: &'static str, message: &'static str, members: &str);
}

static MEMBERS_LOG: OnceLock<Box<dyn MembersLog>> = OnceLock::new();

/// Installs the process's [`MembersLog`] (once: later calls give theirs back).
pub fn set_members_log(log: Box<dyn MembersLog>) -> Result<(), Box<dyn MembersLog>> {
    MEMBERS_LOG.set(log)
}

/// The process's [`MembersLog`], when the binary installed one; lines go through tracing
/// otherwise.
pub fn members_log() -> Option<&'static dyn MembersLog> {
    MEMBERS_LOG.get().map(Box::as_ref)
}

/// Appends `"key":` and the JSON string of `value`, after a comma unless `first`. `key` is a
/// name written in the source, with nothing to escape ([`push_key`]).
pub fn push_member(out: &mut impl JsonOut, first: bool, key: &'static str, value: &str) {
    push_key(out, first, key);
    push_string(out, value);
}

/// Appends `"key":`, after a comma unless `first`. `key` is a name written in the source (a
/// `'static` string) and is written as it is, unchecked in a release build: one with anything
/// to escape fails a debug build's assertion (every key ivory writes is in a test).
pub fn push_key(out: &mut impl JsonOut, first: bool, key: &'static str) {
    out.push_text(if first { "\"" } else { ",\"" });
    if cfg!(debug_assertions) && next_escape(key.as_bytes(), 0).is_some() {
        debug_assert!(false, "a JSON key to escape: {key:?}");
        push_content(out, key);
    } else {
        out.push_text(key);
    }
    out.push_text("\":");
}

/// Lengths of the escaped strings whose escaped text a thread remembers: the `verified-images`
/// annotation (JSON inside JSON, so an escape every few bytes) is the same in every answer for
/// the same images, up to its 8 KiB. Shorter strings cost less to escape than to compare.
const REMEMBERED_LEN: std::ops::RangeInclusive<usize> = 256..=8 * 1024 + 64;

thread_local! {
    /// The last remembered string escaped on this thread, and its escaped text (no quotes):
    /// bounded by [`REMEMBERED_LEN`], and at most six times that once escaped (`\u00xx`).
    static LAST_ESCAPED: RefCell<(String, String)> = const {
        RefCell::new((String::new(), String::new()))
    };
}

/// [`push_escaped`] through this thread's last escaped string: reused when `value` is the
/// same text (compared in full, so a different string is never answered with another's).
fn push_remembered(out: &mut impl JsonOut, value: &str, at: usize) {
    LAST_ESCAPED.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return push_escaped(out, value, at);
        };
        let (raw, escaped) = &mut *last;
        if raw.as_str() != value {
            raw.clear();
            escaped.clear();
            push_escaped(escaped, value, at);
            raw.push_str(value);
        }
        out.push_text(escaped);
    });
}

/// Writes `value`, whose first byte needing an escape is at `at`, escaped.
fn push_escaped(out: &mut impl JsonOut, value: &str, mut at: usize) {
    let bytes = value.as_bytes();
    // `value[run..]` is the plain text not yet written; `run` only ever follows an escaped
    // ASCII byte, so it is a character boundary.
    let mut run = 0;
    loop {
        if let Some(escaped) = bytes.get(at).copied().and_then(escape) {
            out.push_text(&value[run..at]);
            out.push_text(escaped);
            run = at + 1;
        }
        match next_escape(bytes, at + 1) {
            Some(next) => at = next,
            None => break,
        }
    }
    out.push_text(&value[run..]);
}

/// Appends `items` as a JSON list of strings.
pub fn push_list(out: &mut impl JsonOut, items: &[String]) {
    out.push_text("[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_text(",");
        }
        push_string(out, item);
    }
    out.push_text("]");
}

/// Appends `map` as a JSON object of strings, in the map's order.
pub fn push_map(out: &mut impl JsonOut, map: &std::collections::BTreeMap<String, String>) {
    out.push_text("{");
    for (i, (key, value)) in map.iter().enumerate() {
        if i > 0 {
            out.push_text(",");
        }
        push_string(out, key);
        out.push_text(":");
        push_string(out, value);
    }
    out.push_text("}");
}

/// Appends `value` as a JSON number, as serde_json writes it, without the allocation of
/// `value.to_string()` (the response's status code, a verified entry's log index).
pub fn push_u64(out: &mut impl JsonOut, value: u64) {
    out.push_text(itoa::Buffer::new().format(value));
}

/// Where the first byte at or after `from` that needs escaping is, eight bytes at a time.
#[inline]
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(eight) = bytes.get(i..i + 8) {
        let mask = escape_mask(word(eight));
        if mask != 0 {
            return Some(i + first_flagged(mask));
        }
        i += 8;
    }
    if i >= bytes.len() {
        return None;
    }
    // The last few bytes: as the last eight when eight were looked at from `from` (those
    // before `i` are plain, so they flag nothing), else padded with plain bytes.
    let start = if i >= from + 8 { bytes.len() - 8 } else { i };
    let mask = escape_mask(word(bytes.get(start..).unwrap_or_default()));
    (mask != 0).then(|| start + first_flagged(mask))
}

/// The byte index, within its word, of the lowest flagged byte of a non-zero mask.
#[inline]
fn first_flagged(mask: u64) -> usize {
    (mask.trailing_zeros() / 8) as usize
}

/// The first eight bytes of `bytes` as one word, the first byte lowest; a shorter slice is
/// padded with a byte that never needs escaping.
#[inline]
fn word(bytes: &[u8]) -> u64 {
    let mut eight = [b'a'; 8];
    match bytes.get(..8) {
        Some(first) => eight.copy_from_slice(first),
        None => {
            for (slot, byte) in eight.iter_mut().zip(bytes) {
                *slot = *byte;
            }
        }
    }
    u64::from_le_bytes(eight)
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each of the eight bytes of `word` (little-endian: the first byte lowest) that may be
/// a control character, `"` or `\`; zero when none is. The lowest bit set always marks such a
/// byte: a subtraction borrows only out of a byte below its bound, so only bytes after a true
/// one can be marked falsely, and bytes of 0x80 and above (UTF-8 sequences) have their high
/// bit cleared by `!word`.
#[inline]
fn escape_mask(word: u64) -> u64 {
    let below = |w: u64, bound: u8| w.wrapping_sub(ONES * u64::from(bound)) & !w & HIGH_BITS;
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    below(word, 0x20) | below(quote, 1) | below(backslash, 1)
}

/// How serde_json escapes `byte`, or `None` when it is written as it is.
fn escape(byte: u8) -> Option<&'static str> {
    match byte {
        b'"' => Some("\\\""),
        b'\\' => Some("\\\\"),
        0x08 => Some("\\b"),
        0x0c => Some("\\f"),
        b'\n' => Some("\\n"),
        b'\r' => Some("\\r"),
        b'\t' => Some("\\t"),
        0..0x20 => CONTROL.get(usize::from(byte)).copied(),
        _ => None,
    }
}

/// `\u00xx` for each control character, in serde_json's lower-case hex.
const CONTROL: [&str; 32] = [
    "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
    "\\u0008", "\\u0009", "\\u000a", "\\u000b", "\\u000c", "\\u000d", "\\u000e", "\\u000f",
    "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017",
    "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f",
];

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn written(value: &str) -> String {
        let mut out = String::new();
        push_string(&mut out, value);
        let mut bytes = Vec::new();
        push_string(&mut bytes, value);
        assert_eq!(out.as_bytes(), bytes.as_slice());
        out
    }

    #[test]
    fn every_byte_that_needs_escaping_is_escaped_as_serde_json_does() {
        for byte in 0u8..0x80 {
            let one = char::from(byte).to_string();
            // Alone, at each position of a word, and past a clean word.
            for at in 0..10 {
                let value = format!("{}{one}{}", "a".repeat(at), "b".repeat(9 - at));
                assert_eq!(
                    written(&value),
                    serde_json::to_string(&value).unwrap(),
                    "{byte:#04x} at {at}"
                );
            }
        }
    }

    /// Two bytes to escape at every pair of positions of strings up to three words long: the
    /// scan resumes after each escape at any offset within a word, and ends in a short tail.
    #[test]
    fn escapes_at_every_pair_of_positions_are_written_as_serde_json_does() {
        for len in 0..24 {
            for first in 0..len {
                for second in first..len {
                    let mut value = vec![b'x'; len];
                    value[first] = b'"';
                    value[second] = b'\n';
                    let value = String::from_utf8(value).unwrap();
                    assert_eq!(written(&value), serde_json::to_string(&value).unwrap());
                }
            }
        }
    }

    /// The annotation's shape, long enough to be remembered.
    fn annotation(image: &str) -> String {
        let entry = format!(
            r#"{{"image":"{image}","digest":"sha256:{}","policy":"p"}}"#,
            "ab".repeat(32)
        );
        format!("[{}]", vec![entry; 4].join(","))
    }

    /// A remembered string answers only the same text: one of the same length that differs
    /// near its start or in its last byte, or a prefix of it, is escaped on its own.
    #[test]
    fn a_long_string_written_again_reuses_its_escaped_text_and_only_its_own() {
        let first = annotation("ghcr.io/acme/app:1");
        assert!(REMEMBERED_LEN.contains(&first.len()), "{}", first.len());
        let same_length = first.replacen("ghcr", "quay", 1);
        let last_byte = format!("{}}}", &first[..first.len() - 1]);
        let prefix = &first[..first.len() - 1];
        let tab_at_end = format!("{}\t", &first[..first.len() - 1]);
        for value in [
            first.as_str(),
            &first,
            &same_length,
            &first,
            &last_byte,
            &last_byte,
            prefix,
            &first,
            &tab_at_end,
            &first,
        ] {
            assert_eq!(written(value), serde_json::to_string(value).unwrap());
        }
    }

    #[test]
    fn text_beyond_ascii_is_written_as_it_is() {
        for value in [
            "",
            "é",
            "ünïcödé text of more than eight bytes",
            "日本語\"の\\文字列\n",
            "🦀🦀🦀",
        ] {
            assert_eq!(written(value), serde_json::to_string(value).unwrap());
        }
    }

    #[test]
    fn numbers_are_written_as_serde_json_writes_them() {
        for value in [
            0,
            7,
            10,
            403,
            99_999,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut out = String::new();
            push_u64(&mut out, value);
            assert_eq!(out, serde_json::to_string(&value).unwrap());
        }
    }

    #[test]
    fn lists_and_maps_of_strings_are_written_as_serde_json_writes_them() {
        let items = vec![String::new(), "a\"b".to_owned(), "\n".to_owned()];
        let map: std::collections::BTreeMap<String, String> = [("k\t", "v"), ("", "\u{1}")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into();
        let mut out = String::new();
        push_list(&mut out, &items);
        assert_eq!(out, serde_json::to_string(&items).unwrap());
        out.clear();
        push_list(&mut out, &[]);
        assert_eq!(out, "[]");
        out.clear();
        push_map(&mut out, &map);
        assert_eq!(out, serde_json::to_string(&map).unwrap());
        out.clear();
        push_map(&mut out, &Default::default());
        assert_eq!(out, "{}");
    }

    proptest! {
        #[test]
        fn any_string_is_written_as_serde_json_writes_it(value in any::<String>()) {
            prop_assert_eq!(written(&value), serde_json::to_string(&value).unwrap());
        }

        #[test]
        fn joined_parts_are_written_as_their_joined_string(
            parts in proptest::collection::vec(any::<String>(), 0..5),
            separator in prop::sample::select(vec![",", "=", "\"\n"]),
        ) {
            let mut out = String::new();
            push_joined(&mut out, parts.iter().map(String::as_str), separator);
            prop_assert_eq!(out, serde_json::to_string(&parts.join(separator)).unwrap());
        }

        #[test]
        fn members_are_an_objects_members(
            pairs in proptest::collection::vec(
                (prop::sample::select(vec!["policy", "images", "a_b", "x.y"]), any::<String>()),
                1..5,
            ),
        ) {
            let mut out = String::from("{");
            for (i, (k, v)) in pairs.iter().enumerate() {
                push_member(&mut out, i == 0, k, v);
            }
            out.push('}');
            let parsed: std::collections::BTreeMap<String, String> =
                serde_json::from_str(&out).unwrap();
            // Duplicate keys keep the last value, as serde_json reads them.
            let expected: std::collections::BTreeMap<String, String> =
                pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            prop_assert_eq!(parsed, expected);
        }

        #[test]
        fn any_number_is_written_as_serde_json_writes_it(value in any::<u64>()) {
            let mut out = Vec::new();
            push_u64(&mut out, value);
            prop_assert_eq!(out, serde_json::to_vec(&value).unwrap());
        }

        /// Long strings, several alike and some repeated, in any order on one thread.
        #[test]
        fn long_strings_in_any_order_are_written_as_serde_json_writes_them(
            picks in proptest::collection::vec((0usize..4, any::<u8>(), 0usize..400), 1..24)
        ) {
            let bases = [
                annotation("ghcr.io/acme/app:1"),
                annotation("ghcr.io/acme/app:2"),
                annotation("é\\\"").repeat(3),
                "plain text ".repeat(40),
            ];
            for (base, byte, at) in picks {
                let mut value = bases[base].clone().into_bytes();
                // Now and then one byte changed (kept ASCII, so the text stays UTF-8).
                if byte % 3 == 0 && value.get(at).is_some_and(u8::is_ascii) {
                    value[at] = byte % 0x80;
                }
                let value = String::from_utf8(value).unwrap();
                prop_assert_eq!(written(&value), serde_json::to_string(&value).unwrap());
            }
        }

        #[test]
        fn mostly_plain_strings_are_written_as_serde_json_writes_them(
            value in "([a-z0-9:/@._-]{0,20}[\"\\\\\u{0}-\u{1f}\u{7f}é]?){0,12}"
        ) {
            prop_assert_eq!(written(&value), serde_json::to_string(&value).unwrap());
        }
    }
}

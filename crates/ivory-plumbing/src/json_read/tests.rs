//! The oracle: serde_json. Whatever this reader reads, serde_json reads the same; what it
//! refuses, serde_json may read or refuse.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{MAX_DEPTH, Outside, from_str};

/// Both readers on `text`: this one's answer must be serde_json's when it gives one.
fn agree<T>(text: &str) -> Result<T, Outside>
where
    T: for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
{
    let fast = from_str::<T>(text);
    if let Ok(value) = &fast {
        let slow = serde_json::from_str::<T>(text);
        assert_eq!(slow.as_ref().ok(), Some(value), "{text:?}: {slow:?}");
    }
    fast
}

/// Whether every string of `value` (keys too) is written without an escape.
fn plain(value: &Value) -> bool {
    let clean = |s: &str| !s.chars().any(|c| c == '"' || c == '\\' || c < ' ');
    match value {
        Value::String(s) => clean(s),
        Value::Number(n) => n.is_u64() || n.is_i64(),
        Value::Array(items) => items.iter().all(plain),
        Value::Object(map) => map.iter().all(|(k, v)| clean(k) && plain(v)),
        Value::Bool(_) | Value::Null => true,
    }
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-z0-9 .:/@-]{0,12}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z_.\"\\\\ ]{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A type reading a few fields and skipping the rest, as the review's types do.
#[derive(Debug, PartialEq, Deserialize)]
struct Few {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    items: Option<Vec<Few>>,
    #[serde(default)]
    flag: Option<bool>,
    #[serde(default)]
    count: Option<u32>,
    #[serde(default)]
    op: Option<Op>,
}

#[derive(Debug, PartialEq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
enum Op {
    Create,
    Delete,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any JSON, compact or pretty: read as serde_json reads it, and always read when it is in
    /// the subset (no escapes where read, integers only, not too deep).
    #[test]
    fn values_are_read_as_serde_json_reads_them(value in any_value()) {
        for text in [value.to_string(), serde_json::to_string_pretty(&value).unwrap()] {
            let read = agree::<Value>(&text);
            if plain(&value) && depth(&value) <= MAX_DEPTH {
                prop_assert_eq!(read.as_ref(), Ok(&value), "{}", text);
            }
        }
    }

    /// Any JSON as a type that skips most of it: skipped values may hold anything.
    #[test]
    fn skipped_values_are_skipped_as_serde_json_skips_them(value in any_value(), name in "[a-z]{0,6}") {
        let text = json!({"other": value, "name": name, "more": [value, {"x": value}]}).to_string();
        let read = agree::<Few>(&text);
        if depth(&value) + 2 <= MAX_DEPTH {
            prop_assert!(read.is_ok(), "{}", text);
        }
    }

    /// Text one edit away from JSON: never read as something serde_json does not read.
    #[test]
    fn broken_text_is_never_read_otherwise(
        value in any_value(),
        at in any::<prop::sample::Index>(),
        edit in prop::sample::select(vec![
            "", "\"", "\\", ",", ":", "{", "}", "[", "]", "0", "-", ".", "e", "n", "\u{1}", " ", "\\u",
        ]),
        replace in any::<bool>(),
    ) {
        let text = json!({"name": "n", "other": value, "items": [{"flag": true}]}).to_string();
        let mut at = at.index(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let mut end = at;
        if replace && at < text.len() {
            end += 1;
            while !text.is_char_boundary(end) {
                end += 1;
            }
        }
        let broken = format!("{}{edit}{}", &text[..at], &text[end..]);
        let _ = agree::<Few>(&broken);
        let _ = agree::<Value>(&broken);
    }
}

#[test]
fn typed_fields_read_as_serde_json_reads_them() {
    let text = r#" { "name" : "web", "labels": {"app": "web", "tier": "a"}, "skip": {"deep": [1, -2, 3.5e-7, "s\"q\\n\t", null, true, false, {}, []]},
        "items": [ {"name": "c0", "count": 7, "flag": false, "op": "DELETE"}, {} ], "op": "CREATE", "count": 4294967295 } "#;
    let read: Few = agree(text).expect("in the subset");
    assert_eq!(read.name.as_deref(), Some("web"));
    assert_eq!(read.op, Some(Op::Create));
    assert_eq!(read.items.as_ref().map(Vec::len), Some(2));
}

#[test]
fn what_is_outside_the_subset_is_refused() {
    let outside = [
        // escapes in read strings, `\u` anywhere
        r#"{"name": "a\"b"}"#,
        r#"{"skip": "\u0041"}"#,
        // floats where read, `-0`, integers past 64 bits, numbers out of the type's range
        r#"{"count": 1.5}"#,
        "-0",
        "18446744073709551616",
        r#"{"count": 4294967296}"#,
        // a struct as a list, an enum as an object, an unknown variant
        r#"["web"]"#,
        r#"{"op": {"CREATE": null}}"#,
        r#"{"op": "UPDATE"}"#,
        // too deep
        &format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1)),
    ];
    for text in outside {
        assert_eq!(
            from_str::<Value>(text).and_then(|_| from_str::<Few>(text)),
            Err(Outside),
            "{text}"
        );
    }
    // Not JSON at all: refused, as serde_json refuses it.
    for text in [
        "",
        "{",
        r#"{"a":1,}"#,
        "[1,]",
        "[1 2]",
        "01",
        "1.",
        "-",
        "tru",
        r#"{"a" 1}"#,
        "{} x",
        "\"\u{1}\"",
        r#"{"a":"\x"}"#,
        "{'a':1}",
    ] {
        assert_eq!(from_str::<Value>(text), Err(Outside), "{text}");
        assert!(serde_json::from_str::<Value>(text).is_err(), "{text}");
    }
}

#[test]
fn depth_up_to_the_limit_is_read() {
    let text = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert_eq!(agree::<Value>(&text).map(|v| depth(&v)), Ok(MAX_DEPTH));
}

/// Skipped text: the same grammar and the same depth limit as text that is read.
#[test]
fn skipped_text_that_is_not_json_or_too_deep_is_refused() {
    for text in [
        "{",
        "[",
        "{]",
        "[}",
        "[1,]",
        "[,1]",
        "[1 2]",
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        r#"{"a":}"#,
        r#"{1:2}"#,
        r#"{"a":1 "b":2}"#,
        "[[]",
        "[]]",
        "01",
        "tru",
        r#""\x""#,
        "[{\"a\":[}]]",
    ] {
        let skipped = format!(r#"{{"skip": {text}, "name": "n"}}"#);
        assert_eq!(from_str::<Few>(&skipped), Err(Outside), "{skipped}");
        assert!(serde_json::from_str::<Few>(&skipped).is_err(), "{skipped}");
    }
    for (lists, read) in [(MAX_DEPTH - 1, true), (MAX_DEPTH, false)] {
        let deep = format!(
            "{}0{}",
            "[{\"k\":".repeat(lists / 2),
            "}]".repeat(lists / 2)
        );
        let deep = if lists % 2 == 1 {
            format!("[{deep}]")
        } else {
            deep
        };
        let skipped = format!(r#"{{"skip": {deep}, "name": "n"}}"#);
        assert_eq!(agree::<Few>(&skipped).is_ok(), read, "{lists} deep");
    }
}

proptest! {
    /// A word's first run end is found exactly, whatever the bytes around it.
    #[test]
    fn the_first_run_end_of_a_word_is_exact(word in any::<[u8; 8]>()) {
        let found = super::run_ends(u64::from_le_bytes(word));
        let first = word.iter().position(|b| super::ends_run(*b));
        prop_assert_eq!(
            (found != 0).then(|| (found.trailing_zeros() / 8) as usize),
            first
        );
    }
}

#[test]
fn every_byte_ends_a_run_where_json_says() {
    for byte in 0..=255u8 {
        for at in 0..8 {
            let mut word = [b'a'; 8];
            word[at] = byte;
            let found = super::run_ends(u64::from_le_bytes(word));
            let expected = (byte < 0x20 || byte == b'"' || byte == b'\\').then_some(at);
            assert_eq!(
                (found != 0).then(|| (found.trailing_zeros() / 8) as usize),
                expected,
                "{byte:#04x} at {at}"
            );
        }
    }
}

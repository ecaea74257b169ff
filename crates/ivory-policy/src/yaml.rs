//! YAML as ivory reads and writes it. Reading uses the YAML 1.2 core schema (`yes`, `on`, `y` and `0755` stay strings,
//! as Kubernetes' own decoder leaves them for string fields), with serde-saphyr's limits on
//! alias expansion and nesting so a hostile document cannot balloon while it is parsed.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A parse error; render it with [`describe`] to name the line and column.
pub type Error = serde_saphyr::Error;

pub(crate) fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}

/// Parses one YAML document.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// Writes `value` as one YAML document. Long single-line strings (digest-pinned image
/// references) stay on one line instead of being folded, so they can be read and grepped.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    let options = serde_saphyr::ser_options! {
        folded_wrap_chars: usize::MAX,
    };
    serde_saphyr::to_string_with_options(value, options)
}

/// The parser's message with its location, counting lines from `first_line` (1-based) so a
/// document cut out of a larger file is located in the whole file.
pub fn describe(err: &Error, first_line: usize) -> String {
    let options = serde_saphyr::render_options! {
        snippets: serde_saphyr::SnippetMode::Off,
        line_offset: u64::try_from(first_line.saturating_sub(1)).unwrap_or(0),
    };
    err.render_with_options(options)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    #[test]
    fn yaml_1_1_spellings_stay_strings() {
        let v: Value = super::from_str("a: y\nb: on\nc: 0755\nd: 1_000\ne: true\nf: 7\n").unwrap();
        assert_eq!(
            v,
            json!({"a": "y", "b": "on", "c": "0755", "d": "1_000", "e": true, "f": 7})
        );
    }

    #[test]
    fn long_strings_stay_on_one_line_and_round_trip() {
        let image = format!("registry.example/app:v1@sha256:{}", "a".repeat(64));
        let value = json!({"image": image, "pem": "line one\nline two\n"});
        let text = super::to_string(&value).unwrap();
        assert!(text.contains(&format!("image: {image}\n")), "{text}");
        assert_eq!(super::from_str::<Value>(&text).unwrap(), value);
    }
}

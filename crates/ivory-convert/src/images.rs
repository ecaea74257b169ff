//! Image references: Kyverno's legacy wildcard patterns (`go-wildcard`: `*` any run of
//! characters, `?` exactly one, nothing else special) as ImageValidatingPolicy globs and as CEL.
//!
//! Kyverno's legacy engine matches `imageReferences` and `skipImageReferences` against its
//! normalised image string (`pkg/utils/image/infos.go`: `docker.io/` prefixed when the first path
//! element is not a host, the tag dropped next to a digest, `:latest` when neither is written).
//! ivory matches an image as written and under its other spellings, Kyverno's normalised one
//! among them, so the converted `matchImageReferences` select every image Kyverno's patterns
//! select (docs/kyverno-semantics.md §14 says when they select more).

/// A CEL string literal for `text` (single-quoted, escaped).
pub(crate) fn cel_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            _ => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A CEL list literal of strings.
pub(crate) fn cel_string_list(items: &[String]) -> String {
    let inner: Vec<String> = items.iter().map(|s| cel_string(s)).collect();
    format!("[{}]", inner.join(", "))
}

/// The `matchImageReferences[].glob` that matches what the wildcard `pattern` matches: `*` and
/// `?` keep their meaning, the glob syntax go-wildcard does not have (`[`, `]`, `{`, `}`, `\`)
/// is escaped.
pub(crate) fn wildcard_to_glob(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if matches!(c, '[' | ']' | '{' | '}' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// An anchored RE2 expression matching what the wildcard `pattern` matches.
pub(crate) fn wildcard_to_regex(pattern: &str) -> String {
    let mut out = String::from("^");
    let mut literal = String::new();
    for c in pattern.chars() {
        match c {
            '*' | '?' => {
                out.push_str(&regex::escape(&literal));
                literal.clear();
                out.push_str(if c == '*' { ".*" } else { "." });
            }
            _ => literal.push(c),
        }
    }
    out.push_str(&regex::escape(&literal));
    out.push('$');
    out
}

/// Whether `text` contains a wildcard character.
pub(crate) fn has_wildcard(text: &str) -> bool {
    text.contains(['*', '?'])
}

/// CEL: whether the string expression `subject` matches any of the wildcard `patterns`.
pub(crate) fn matches_any(subject: &str, patterns: &[String]) -> String {
    if patterns.is_empty() {
        return "false".to_owned();
    }
    let parts: Vec<String> = patterns
        .iter()
        .map(|p| {
            if has_wildcard(p) {
                format!("{subject}.matches({})", cel_string(&wildcard_to_regex(p)))
            } else {
                format!("{subject} == {}", cel_string(p))
            }
        })
        .collect();
    parts.join(" || ")
}

/// Whether `name` can be written as a CEL field selection (`x.name`): an identifier that is
/// not a reserved word; other names are written as an index (`x['name']`).
pub(crate) fn is_cel_identifier(name: &str) -> bool {
    const RESERVED: [&str; 21] = [
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
        "true",
        "false",
        "null",
    ];
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !RESERVED.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_cel::{Activation, NoHost, Scope};

    fn eval_bool(expr: &str, image: &str) -> bool {
        let program = ivory_cel::compile(expr, &Scope::new(["ref"]))
            .unwrap_or_else(|e| panic!("{expr}: {e}"));
        let mut act = Activation::new(&NoHost);
        act.bind_json("ref", &serde_json::Value::String(image.to_owned()));
        program
            .evaluate_bool(&act)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
    }

    #[test]
    fn wildcards_become_globs_and_regexes() {
        assert_eq!(wildcard_to_glob("ghcr.io/[a]{b}*"), r"ghcr.io/\[a\]\{b\}*");
        assert_eq!(wildcard_to_regex("ghcr.io/a?/*"), r"^ghcr\.io/a./.*$");
        let include = vec![
            "ghcr.io/acme/*".to_owned(),
            "docker.io/nginx:?.*".to_owned(),
        ];
        let skip = vec!["ghcr.io/acme/skip*".to_owned()];
        let expr = format!(
            "({}) && !({})",
            matches_any("ref", &include),
            matches_any("ref", &skip)
        );
        assert!(eval_bool(&expr, "ghcr.io/acme/app:v1"));
        assert!(!eval_bool(&expr, "ghcr.io/acme/skipped:v1"));
        assert!(!eval_bool(&expr, "ghcr.io/other/app"));
        assert!(eval_bool(&expr, "docker.io/nginx:1.27"));
        assert!(!eval_bool(&expr, "docker.io/nginx:12.1"));
    }
}

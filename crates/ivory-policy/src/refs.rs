//! Static references to `attestors.NAME` / `attestations.NAME` in CEL source. Both maps only hold
//! the names the policy declares, so any other name is a guaranteed runtime error in Kyverno
//! ("no such key" / "attestation not found in policy"); ivory reports it at load time instead.

use std::sync::LazyLock;

use regex::Regex;

/// String literals: a match starting inside one (e.g. a message mentioning `attestors.x`) is ignored.
static STRING_LITERAL: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r#"'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*""#).ok());

static MEMBER: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r#"(?:^|[^.\w])(attestors|attestations)\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*(?:'([^']*)'|"([^"]*)")\s*\])"#)
        .ok()
});

/// `(map, key)` pairs such as `("attestors", "cosign")`, in source order.
pub(crate) fn member_refs(source: &str) -> Vec<(String, String)> {
    let (Some(strings), Some(member)) = (STRING_LITERAL.as_ref(), MEMBER.as_ref()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for caps in member.captures_iter(source) {
        let key = caps.get(2).or_else(|| caps.get(3)).or_else(|| caps.get(4));
        if let (Some(map), Some(key)) = (caps.get(1), key) {
            // Skip matches that sit inside a string literal.
            let inside_literal = strings
                .find_iter(source)
                .any(|lit| lit.start() < map.start() && map.start() < lit.end());
            if !inside_literal {
                out.push((map.as_str().to_owned(), key.as_str().to_owned()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(s: &str) -> Vec<(String, String)> {
        member_refs(s)
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        (a.to_owned(), b.to_owned())
    }

    #[test]
    fn finds_dotted_and_indexed_names() {
        assert_eq!(
            refs(
                "verifyImageSignatures(i, [attestors.cosign, attestors['my-key']]) && verifyAttestationSignatures(i, attestations.slsa, [attestors[\"n\"]])"
            ),
            [
                pair("attestors", "cosign"),
                pair("attestors", "my-key"),
                pair("attestations", "slsa"),
                pair("attestors", "n"),
            ]
        );
    }

    #[test]
    fn ignores_literals_and_other_roots() {
        assert!(refs("'attestors.x is missing' + object.attestors.y + myattestors.z").is_empty());
    }
}

//! Listing pages (`/v2/_catalog`, `/v2/<name>/tags/list`), read one page at a time.
//!
//! A registry under audit is hostile: a page may hold names outside the OCI distribution
//! grammar (control characters for the terminal, names no kubelet can pull), ignore `n`, or
//! name a next page elsewhere. So a page is parsed without building a JSON tree, each name is
//! checked against the grammar (invalid ones are only counted: their bytes go nowhere), at
//! most `n` names after `last` are kept (the smallest, so an over-full page is cut the way
//! the registry should have cut it and the rest comes on the next page), and the `Link`
//! header only says whether a next page exists: the next URL is built by ivory (`n` and
//! `last`), so a link can neither leave the origin nor choose the request.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;

/// The URL type of [`next_page_link`].
pub use reqwest::Url;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Longest `host/repository` the distribution spec allows.
pub const MAX_NAME_LEN: usize = 255;
/// Longest tag the distribution spec allows.
pub const MAX_TAG_LEN: usize = 128;
/// `Link` header values longer than this (all of them together) are ignored: no next page.
pub const MAX_LINK_BYTES: usize = 4096;
/// Link entries looked at in one header.
const MAX_LINKS: usize = 16;

/// What a listing lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameKind {
    /// Repository names (`_catalog`, field `repositories`), checked with their host.
    Repository,
    /// Tags (`tags/list`, field `tags`).
    Tag,
}

impl NameKind {
    /// The JSON field of the page that holds the names.
    pub fn field(self) -> &'static str {
        match self {
            NameKind::Repository => "repositories",
            NameKind::Tag => "tags",
        }
    }
}

/// Whether `tag` holds signatures or attestations rather than an image: cosign's
/// `sha256-<hex>.sig|.att|.sbom` tags and the OCI referrers fallback tag `sha256-<hex>`.
/// An audit of a registry's images skips them.
pub fn is_signature_tag(tag: &str) -> bool {
    let Some(rest) = tag.strip_prefix("sha256-") else {
        return false;
    };
    let hex = rest.split('.').next().unwrap_or(rest);
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `tag` matches `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    match b.first() {
        Some(c) if c.is_ascii_alphanumeric() || *c == b'_' => {}
        _ => return false,
    }
    b.len() <= MAX_TAG_LEN
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Whether `name` is a repository name of the distribution grammar: components
/// `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*` joined by `/`, and `host/name` at most
/// [`MAX_NAME_LEN`] bytes.
pub fn valid_repository(host: &str, name: &str) -> bool {
    host.len() + 1 + name.len() <= MAX_NAME_LEN && name.split('/').all(valid_component)
}

/// One path component: alphanumeric runs joined by `.`, `_`, `__` or any run of `-`.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: &u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    let mut i = 0;
    loop {
        let start = i;
        while i < b.len() && alnum(&b[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == b.len() {
            return true;
        }
        let sep = i;
        while i < b.len() && !alnum(&b[i]) {
            i += 1;
        }
        let ok = match &b[sep..i] {
            b"." | b"_" | b"__" => true,
            s => s.iter().all(|x| *x == b'-'),
        };
        if !ok || i == b.len() {
            return false;
        }
    }
}

/// Whether `name` is a valid `kind` name on `host`.
pub fn valid_name(kind: NameKind, host: &str, name: &str) -> bool {
    match kind {
        NameKind::Repository => valid_repository(host, name),
        NameKind::Tag => valid_tag(name),
    }
}

/// One parsed page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// Valid names after `last`, sorted, distinct, at most `n`.
    pub names: Vec<String>,
    /// Entries outside the grammar (skipped; never shown).
    pub invalid: usize,
    /// Valid names after `last` beyond the `n` kept: the registry sent more than asked.
    pub cut: usize,
    /// Entries of the page (any kind).
    pub entries: usize,
}

/// Why a page is not a listing page. Messages never quote the body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// Not JSON, or not an object whose field is an array of strings (the serde category,
    /// line and column only).
    #[error(
        "listing page is not a JSON object with a string array `{field}` ({what} at line {line} column {column})"
    )]
    Shape {
        /// The field asked for.
        field: &'static str,
        /// serde_json's error category.
        what: &'static str,
        /// Where.
        line: usize,
        /// Where.
        column: usize,
    },
}

/// Parses a page body: the string array `kind.field()` (absent or null: empty), keeping
/// the `n` smallest distinct valid names greater than `last` (the host checks repository
/// lengths). Memory is the body plus `n` names, whatever the page holds.
pub fn parse_page(
    body: &[u8],
    kind: NameKind,
    host: &str,
    last: Option<&str>,
    n: usize,
) -> Result<Page, PageError> {
    let mut acc = Acc {
        kind,
        host,
        last,
        n,
        kept: BTreeSet::new(),
        page: Page::default(),
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let shape = |e: serde_json::Error| PageError::Shape {
        field: kind.field(),
        what: match e.classify() {
            serde_json::error::Category::Io => "I/O error",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "unexpected value",
            serde_json::error::Category::Eof => "early end",
        },
        line: e.line(),
        column: e.column(),
    };
    PageSeed(&mut acc)
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(shape)?;
    acc.page.names = acc.kept.into_iter().collect();
    Ok(acc.page)
}

/// The page being collected.
struct Acc<'a> {
    kind: NameKind,
    host: &'a str,
    last: Option<&'a str>,
    n: usize,
    kept: BTreeSet<String>,
    page: Page,
}

impl Acc<'_> {
    fn entry(&mut self, name: &str) {
        self.page.entries += 1;
        if !valid_name(self.kind, self.host, name) {
            self.page.invalid += 1;
            return;
        }
        if self.last.is_some_and(|l| name <= l) || self.kept.contains(name) {
            return;
        }
        // Keep the n smallest: a full set only takes a name below its largest.
        if self.kept.len() >= self.n {
            match self.kept.last() {
                Some(max) if name < max.as_str() => {
                    self.kept.pop_last();
                }
                _ => {
                    self.page.cut += 1;
                    return;
                }
            }
            self.page.cut += 1;
        }
        self.kept.insert(name.to_owned());
    }
}

/// The top-level object: only the names field is read; the rest is skipped unbuilt.
struct PageSeed<'a, 'b>(&'a mut Acc<'b>);

impl<'de> DeserializeSeed<'de> for PageSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PageSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a listing page object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let field = self.0.kind.field();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == field {
                map.next_value_seed(NamesSeed(&mut *self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// The names array (or null).
struct NamesSeed<'a, 'b>(&'a mut Acc<'b>);

impl<'de> DeserializeSeed<'de> for NamesSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NamesSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of strings or null")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(name) = seq.next_element::<Name<'de>>()? {
            self.0.entry(&name.0);
        }
        Ok(())
    }
}

/// One string entry, borrowed when it has no escapes.
struct Name<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Name<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Whether the `Link` header values (`<url>; rel="next"`, RFC 8288) name a next page of the
/// listing at `page_url`: a link resolved against it with the same scheme, host, port and
/// path. Anything else (another origin or path, over [`MAX_LINK_BYTES`], unparsable) is no
/// next page. Returns the link, resolved, for the caller's checks; ivory does not fetch it.
pub fn next_page_link(values: &[&[u8]], page_url: &Url) -> Option<Url> {
    if values.iter().map(|v| v.len()).sum::<usize>() > MAX_LINK_BYTES {
        return None;
    }
    values
        .iter()
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .take(MAX_LINKS)
        .find_map(|link| {
            let link = link.trim();
            let (target, params) = link.strip_prefix('<')?.split_once('>')?;
            let is_next = params.split(';').any(|p| {
                let Some((k, v)) = p.split_once('=') else {
                    return false;
                };
                k.trim().eq_ignore_ascii_case("rel")
                    && v.trim()
                        .trim_matches('"')
                        .split_ascii_whitespace()
                        .any(|r| r.eq_ignore_ascii_case("next"))
            });
            if !is_next {
                return None;
            }
            let url = page_url.join(target).ok()?;
            (url.origin() == page_url.origin() && url.path() == page_url.path()).then_some(url)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_tags_are_not_images() {
        let hex = "0e1dfb0e6a9d8ade72c3c7e96a1a79378d7fadba2f48659904af92517bbca5aa";
        assert!(is_signature_tag(&format!("sha256-{hex}.sig")));
        assert!(is_signature_tag(&format!("sha256-{hex}.att")));
        assert!(is_signature_tag(&format!("sha256-{hex}")));
        assert!(!is_signature_tag("sha256-latest"));
        assert!(!is_signature_tag("v1"));
    }

    #[test]
    fn tags_follow_the_grammar() {
        for ok in ["v1", "latest", "_x", "1.2.3-rc_1", &"a".repeat(128)] {
            assert!(valid_tag(ok), "{ok}");
        }
        for bad in [
            "",
            ".v1",
            "-v1",
            "v1\x1b[2K",
            "v\r\n1",
            "v1\u{202e}",
            "v/1",
            "v:1",
            "é",
            &"a".repeat(129),
        ] {
            assert!(!valid_tag(bad), "{bad:?}");
        }
    }

    #[test]
    fn repositories_follow_the_grammar() {
        for ok in [
            "a",
            "a/b",
            "a-b",
            "a--b",
            "a__b",
            "a.b_c/d0",
            "library/alpine",
        ] {
            assert!(valid_repository("h:5000", ok), "{ok}");
        }
        for bad in [
            "",
            "A",
            "a/",
            "/a",
            "a//b",
            "a..b",
            "a___b",
            "a-",
            "_a",
            "a.-b",
            "a\x1b",
            "a b",
            "a\u{2066}",
            "a:b",
        ] {
            assert!(!valid_repository("h:5000", bad), "{bad:?}");
        }
        // 255 with the host and its slash.
        let host = "h:5000";
        assert!(valid_repository(host, &"a".repeat(255 - host.len() - 1)));
        assert!(!valid_repository(host, &"a".repeat(256 - host.len() - 1)));
    }

    #[test]
    fn pages_keep_the_n_smallest_valid_names_after_last() {
        let body = br#"{"name":"r","tags":["b","a","a","d","c\u001b","e","c","x\r\n",7]}"#;
        let e = parse_page(body, NameKind::Tag, "h", None, 2).unwrap_err();
        assert!(matches!(e, PageError::Shape { .. }), "{e}");
        let body = br#"{"name":"r","tags":["b","a","a","d","c\u001b","e","c","x\r\n"],"x":[[{}]]}"#;
        let p = parse_page(body, NameKind::Tag, "h", None, 2).unwrap();
        assert_eq!(p.names, ["a", "b"]);
        assert_eq!(p.invalid, 2);
        assert_eq!(p.entries, 8);
        assert_eq!(p.cut, 3);
        let p = parse_page(body, NameKind::Tag, "h", Some("b"), 10).unwrap();
        assert_eq!(p.names, ["c", "d", "e"]);
        assert_eq!(p.cut, 0);
        let p = parse_page(br#"{"tags":null}"#, NameKind::Tag, "h", None, 3).unwrap();
        assert!(p.names.is_empty());
        let p = parse_page(
            br#"{"repositories":["a/b","A"]}"#,
            NameKind::Repository,
            "h",
            None,
            3,
        )
        .unwrap();
        assert_eq!((p.names.len(), p.invalid), (1, 1));
        for bad in [
            &b"[]"[..],
            b"{\"tags\":{}}",
            b"{\"tags\":[\"a\"]} x",
            b"\xff",
        ] {
            assert!(parse_page(bad, NameKind::Tag, "h", None, 3).is_err());
        }
    }

    #[test]
    fn shape_errors_never_quote_the_body() {
        let e = parse_page(
            br#"{"tags":[{"SECRET\u001b":1}]}"#,
            NameKind::Tag,
            "h",
            None,
            3,
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains("SECRET") && !e.contains('\x1b'), "{e}");
    }

    #[test]
    fn next_links_stay_on_the_listing() {
        let page = Url::parse("https://r.example:5000/v2/a/tags/list?n=3").unwrap();
        let next = |v: &str| next_page_link(&[v.as_bytes()], &page).map(|u| u.to_string());
        assert_eq!(
            next(r#"</v2/a/tags/list?n=3&last=c>; rel="next""#).as_deref(),
            Some("https://r.example:5000/v2/a/tags/list?n=3&last=c")
        );
        assert!(next("<https://r.example:5000/v2/a/tags/list?last=c>; rel=next").is_some());
        for elsewhere in [
            r#"<https://evil.example/v2/a/tags/list?last=c>; rel="next""#,
            r#"<//evil.example/v2/a/tags/list>; rel="next""#,
            r#"<http://r.example:5000/v2/a/tags/list>; rel="next""#,
            r#"<https://r.example:5001/v2/a/tags/list>; rel="next""#,
            r#"</v2/b/tags/list?last=c>; rel="next""#,
            r#"</v2/a/tags/list?last=c>; rel="prev""#,
            r#"/v2/a/tags/list?last=c; rel="next""#,
        ] {
            assert_eq!(next(elsewhere), None, "{elsewhere}");
        }
        let long = format!(r#"</v2/a/tags/list?last={}>; rel="next""#, "c".repeat(5000));
        assert_eq!(next(&long), None);
    }
}

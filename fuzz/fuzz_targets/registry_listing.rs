//! A registry listing page (`/v2/_catalog`, `/v2/<name>/tags/list`) and its `Link` header, as
//! `ivory audit` reads them from a registry it does not trust.
//!
//! Input: a mode byte (bit 0: catalog or tags; bit 1: a `last` to list after), a byte for
//! the page size `n` (1–64), two bytes for the length of the `Link` value, that value, then
//! the page body.
//!
//! Checked properties: every name `parse_page` keeps matches the distribution grammar
//! (checked against the spec's regular expressions, independently of the parser), names are
//! sorted, distinct, after `last`, at most `n`; the counts add up; an error never quotes the
//! body; a next-page link `next_page_link` accepts never leaves the page's origin or path.
#![no_main]

use std::sync::LazyLock;

use ivory_registry::listing::{NameKind, Url, next_page_link, parse_page};
use libfuzzer_sys::fuzz_target;
use regex::Regex;

/// The distribution spec's grammar, as written there.
static REPOSITORY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
        .unwrap()
});
static TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$").unwrap());

const HOST: &str = "registry.example:5000";

/// Page URLs the link is resolved against: both schemes, a default and an explicit port.
static PAGES: LazyLock<Vec<Url>> = LazyLock::new(|| {
    [
        "https://registry.example:5000/v2/team/app/tags/list?n=3",
        "http://127.0.0.1:5000/v2/_catalog?n=3&last=a",
        "https://registry.example/v2/a/tags/list",
    ]
    .iter()
    .map(|u| Url::parse(u).unwrap())
    .collect()
});

fuzz_target!(|data: &[u8]| {
    let [mode, n, l0, l1, rest @ ..] = data else {
        return;
    };
    let kind = if mode & 1 == 0 {
        NameKind::Tag
    } else {
        NameKind::Repository
    };
    let last = (mode & 2 != 0).then_some("m");
    let n = 1 + usize::from(*n % 64);
    let link_len = usize::from(u16::from_le_bytes([*l0, *l1])).min(rest.len());
    let (link, body) = rest.split_at(link_len);

    match parse_page(body, kind, HOST, last, n) {
        Ok(page) => {
            assert!(page.names.len() <= n, "more than n names kept");
            assert!(
                page.names.windows(2).all(|w| w[0] < w[1]),
                "names not sorted and distinct"
            );
            for name in &page.names {
                let ok = match kind {
                    NameKind::Tag => TAG.is_match(name),
                    NameKind::Repository => {
                        REPOSITORY.is_match(name) && HOST.len() + 1 + name.len() <= 255
                    }
                };
                assert!(ok, "{kind:?} {name:?} accepted outside the grammar");
                assert!(last.is_none_or(|l| name.as_str() > l), "{name:?} not after last");
            }
            assert!(
                page.names.len() + page.invalid + page.cut <= page.entries,
                "counts exceed the entries"
            );
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(!shown.chars().any(char::is_control), "control character in {shown:?}");
        }
    }

    for page in PAGES.iter() {
        if let Some(next) = next_page_link(&[link], page) {
            assert_eq!(next.origin(), page.origin(), "link left the origin: {next}");
            assert_eq!(next.path(), page.path(), "link left the listing: {next}");
        }
    }
});

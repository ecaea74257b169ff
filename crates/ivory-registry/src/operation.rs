//! The registry operations ivory performs, named once for messages, logs and counters.

/// One kind of registry call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `HEAD`/`GET` of a manifest by tag, for its digest.
    ResolveDigest,
    /// `GET` of a manifest.
    FetchManifest,
    /// `GET` of a blob.
    FetchBlob,
    /// The referrers API, or its `sha256-<hex>` fallback tag.
    Referrers,
    /// One page of a repository's tags.
    ListTags,
    /// One page of the registry's catalog.
    Catalog,
}

impl Operation {
    /// The operation's name in logs and error messages: `resolve_digest`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::ResolveDigest => "resolve_digest",
            Operation::FetchManifest => "fetch_manifest",
            Operation::FetchBlob => "fetch_blob",
            Operation::Referrers => "referrers",
            Operation::ListTags => "list_tags",
            Operation::Catalog => "catalog",
        }
    }

    /// What the operation was after, in words for a person: `tag`, `manifest`.
    pub fn target(self) -> &'static str {
        match self {
            Operation::ResolveDigest => "tag",
            Operation::FetchManifest => "manifest",
            Operation::FetchBlob => "blob",
            Operation::Referrers => "referrers",
            Operation::ListTags => "tag list",
            Operation::Catalog => "catalog",
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

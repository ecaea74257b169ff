//! Container image references, parsed with go-containerregistry's `name.ParseReference` rules
//! (what Kyverno's CEL `image` library uses), plus Kyverno's `GetImageInfo().String()`
//! normalisation used for digest pinning, and the canonical spelling policies are matched on
//! ([`canonical`]). No regex, so parsing needs no start-up compile (figures in BENCHMARKS.md),
//! and no IO.
//!
//! The egress rule lives here too ([`EgressRule`], [`AddressClass`], [`Cidr`]): which addresses
//! ivory connects to when others choose the host. The registry client judges every connection
//! by it, and the engine's late image-data fetches refuse the always-refused literals early
//! ([`is_metadata_or_unspecified`]).
//!
//! # Parsed once, at the first seam
//!
//! An image is a string only until it leaves the request, the policy or the command line; from
//! there on it is an [`ImageReference`] (registry, repository, tag, digest, the canonical
//! spelling, and [`ImageReference::original`], the text as written, which messages quote). The
//! engine's verifier seam takes it (`ImageVerifier::resolve_digest`, `image_data`,
//! `VerifyRequest::image`), and so do the registry client's calls (`Registry::resolve_digest`,
//! `fetch_manifest`, `fetch_platform_manifest`, `fetch_blob`, `referrers_located`); the listing
//! calls of `ivory audit` take repository and host names. Nothing downstream parses an image
//! again, and the verifier keeps no cache of parsed references. Where each image is parsed, and
//! what an image that does not parse gets:
//!
//! * a matched image of a policy (validating stage): the engine's `validate/plan.rs`, once per
//!   image and policy; the answer is `VerifyError::invalid_reference`, read by the expression
//!   that asks, so the failurePolicy decides (for `verifyDigest`:
//!   `image … does not have a digest`);
//! * an image literal in the policy's CEL (`image.GetMetadata("…")`): `validate/plan.rs`
//!   (`plan_jobs`); not prefetched;
//! * an image an expression names at run time: `validate/late.rs` (`admitted`);
//!   `invalid image reference …` for that expression;
//! * a pinnable image (mutating stage): `mutate.rs` (`normalize`, Kyverno's normalized form);
//!   Kyverno's `invalid image '…' (…)`, a policy error under `Fail`, a warning under `Ignore`;
//! * an image on `ivory verify`'s command line: the binary's `cmd/image_report.rs`
//!   (`Checker::resolve`, `Checker::attestors`); `<image>: invalid image reference (…)`;
//! * a reference ivory builds (the signature tag `sha256-<hex>.sig`/`.att`, the referrers
//!   subject, a pinned or platform manifest) from a parsed reference's parts, an attestor's
//!   `source.repository` or `--signature-repository`: ivory-verify's `verifier::sibling`; the
//!   registry error `InvalidReference`, classified like any registry error.
//!
//! CEL's `image()` library and `parseImageReference` parse the strings an expression hands them:
//! that is a user input of its own.

use std::borrow::Cow;
use std::sync::Arc;

use thiserror::Error;

mod address;
mod canonical;

pub use address::{
    AddressClass, Cidr, CidrError, EGRESS_ALLOW_FLAG, EGRESS_PRIVATE_FLAG, EgressRefusal,
    EgressRule, PrivateNetworks, is_metadata_or_unspecified,
};
pub use canonical::{CANONICAL_DOCKER_HUB, alternative_spellings, canonical, canonical_host};

/// Docker Hub's canonical registry host (`RegistryStr()` of a bare name).
pub const DEFAULT_REGISTRY: &str = "index.docker.io";
/// Registry Kyverno prepends when normalising bare names (`docker.io/nginx:latest`).
pub const KYVERNO_DEFAULT_REGISTRY: &str = "docker.io";
const DEFAULT_TAG: &str = "latest";
const REPOSITORY_CHARS: &str = "abcdefghijklmnopqrstuvwxyz0123456789_-./";
const TAG_CHARS: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.";
const DIGEST_CHARS: &str = "sh:0123456789abcdef";

/// An image reference that could not be parsed; names the input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("could not parse image reference {input:?}: {reason}")]
pub struct ImageRefError {
    /// The text that was given as an image reference.
    pub input: String,
    /// Which rule of go-containerregistry's grammar it broke.
    pub reason: Reason,
}

/// The rule of go-containerregistry's reference grammar an input broke, worded as ggcr words
/// it (Kyverno shows these texts).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Reason {
    /// Empty input, or nothing before a tag or digest.
    #[error("a repository name must be specified")]
    MissingRepository,
    /// A colon with nothing after it (the input is named).
    #[error("{0} must specify a tag name after the colon")]
    EmptyTag(String),
    /// More or fewer than one `@` in a digest reference (the input is named).
    #[error(
        "a digest must contain exactly one '@' separator (e.g. registry/repository@digest) saw: {0}"
    )]
    DigestSeparator(String),
    /// A digest of another algorithm than `sha256`.
    #[error("unsupported digest algorithm: {0}")]
    DigestAlgorithm(String),
    /// A registry that is not an RFC 3986 authority (`host[:port]`).
    #[error("registries must be valid RFC 3986 URI authorities: {0}")]
    Registry(String),
    /// A repository, tag or digest too short or too long.
    #[error("{what} must be between {min} and {max} characters in length: {element}")]
    Length {
        /// `repository`, `tag` or `digest`.
        what: &'static str,
        /// The shortest accepted length.
        min: usize,
        /// The longest accepted length.
        max: usize,
        /// The offending part.
        element: String,
    },
    /// A repository, tag or digest with a character outside its alphabet.
    #[error("{what} can only contain the characters `{allowed}`: {element}")]
    Characters {
        /// `repository`, `tag` or `digest`.
        what: &'static str,
        /// The characters that are accepted.
        allowed: &'static str,
        /// The offending part.
        element: String,
    },
}

/// The result of parsing an image reference.
pub type Result<T> = std::result::Result<T, ImageRefError>;

/// A parsed image reference (tag or digest form). Cloning it is cheap (its parts are shared):
/// one parsed reference travels with every verification job and cache lookup of its image.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ImageReference(Arc<Parts>);

#[derive(Debug, PartialEq, Eq, Hash)]
struct Parts {
    original: String,
    /// Canonical registry host (`index.docker.io` for Docker Hub).
    registry: String,
    /// Repository with the implicit `library/` namespace added on Docker Hub.
    repository: String,
    /// `<registry>/<repository>`, written once: verdict-cache keys read it per lookup.
    repository_name: String,
    /// Tag as used by ggcr: implicit `latest`; `None` for digest references.
    tag: Option<String>,
    /// Tag as written, kept even next to a digest.
    original_tag: Option<String>,
    digest: Option<String>,
    /// Kyverno's registry/path split (docker distribution rules), used for normalisation.
    kyverno_registry: String,
    kyverno_path: String,
}

impl ImageReference {
    /// Parses `s` like go-containerregistry `name.ParseReference` (weak validation):
    /// first as a tag reference, then as a digest reference.
    pub fn parse(s: &str) -> Result<Self> {
        let err = |reason: Reason| ImageRefError {
            input: s.to_owned(),
            reason,
        };
        if s.is_empty() {
            return Err(err(Reason::MissingRepository));
        }
        // ggcr tries a tag reference, then a digest reference. '@' is valid in neither a
        // repository nor a tag, so it alone decides which one can succeed (and whose error
        // to report) without building the other's error.
        let (repo_part, tag, digest) = if s.contains('@') {
            let (base, original_tag, digest) = parse_digest(s).map_err(err)?;
            (base, original_tag, Some(digest))
        } else {
            let (base, tag) = parse_tag(s).map_err(err)?;
            (base, Some(tag).filter(|t| !t.is_empty()), None)
        };
        let (registry, repo) = split_repository(repo_part).map_err(err)?;
        let repository = if !repo.contains('/') && registry == DEFAULT_REGISTRY {
            format!("library/{repo}")
        } else {
            repo.to_owned()
        };
        let (kyverno_registry, kyverno_path) = kyverno_split(repo_part);
        let original_tag = tag.clone();
        Ok(Self(Arc::new(Parts {
            original: s.to_owned(),
            repository_name: format!("{registry}/{repository}"),
            registry,
            repository,
            tag: if digest.is_some() {
                None
            } else {
                Some(tag.unwrap_or_else(|| DEFAULT_TAG.to_owned()))
            },
            original_tag,
            digest,
            kyverno_registry,
            kyverno_path,
        })))
    }

    /// The string this reference was parsed from.
    pub fn original(&self) -> &str {
        &self.0.original
    }

    /// ggcr `RegistryStr()`: `index.docker.io` for Docker Hub names.
    pub fn registry(&self) -> &str {
        &self.0.registry
    }

    /// ggcr `RepositoryStr()`: `library/nginx` for `nginx`.
    pub fn repository(&self) -> &str {
        &self.0.repository
    }

    /// Tag of a tag reference (implicit `latest`); `None` for digest references.
    pub fn tag(&self) -> Option<&str> {
        self.0.tag.as_deref()
    }

    /// `sha256:…` for digest references.
    pub fn digest(&self) -> Option<&str> {
        self.0.digest.as_deref()
    }

    /// Tag or digest (ggcr `Identifier()`).
    pub fn identifier(&self) -> &str {
        self.0
            .digest
            .as_deref()
            .or(self.0.tag.as_deref())
            .unwrap_or(DEFAULT_TAG)
    }

    /// ggcr `Name()`: `<registry>/<repository>` and then `@<digest>` for a digest reference or
    /// `:<tag>` (an implicit `latest` written out) for a tag reference. One spelling per image,
    /// so `nginx` and `index.docker.io/library/nginx:latest` share cache entries.
    pub fn name(&self) -> String {
        match &self.0.digest {
            Some(digest) => format!("{}@{digest}", self.repository_name()),
            None => format!("{}:{}", self.repository_name(), self.identifier()),
        }
    }

    /// ggcr `Repository.Name()`: `<registry>/<repository>` (`index.docker.io/library/nginx`).
    pub fn repository_name(&self) -> &str {
        &self.0.repository_name
    }

    /// Tag as written, also in `repo:tag@digest`; `None` when no tag was written.
    pub fn original_tag(&self) -> Option<&str> {
        self.0.original_tag.as_deref()
    }

    /// Kyverno `GetImageInfo().String()`: `docker.io/nginx:latest` for `nginx`,
    /// `reg/path@sha256:…` for digest references (the tag is dropped then).
    pub fn kyverno_normalized(&self) -> String {
        match &self.0.digest {
            Some(d) => format!("{}/{}@{d}", self.0.kyverno_registry, self.0.kyverno_path),
            None => format!(
                "{}/{}:{}",
                self.0.kyverno_registry,
                self.0.kyverno_path,
                self.0.original_tag.as_deref().unwrap_or(DEFAULT_TAG)
            ),
        }
    }

    /// The canonical spelling of this reference (see [`canonical`]): lower-case host without a
    /// default port, Docker Hub spelled `docker.io` with `library/`, tag and digest as written.
    pub fn canonical_string(&self) -> Cow<'_, str> {
        canonical(&self.0.original)
    }

    /// Pinned form: `<registry>/<path>:<tag>@<digest>` (tag kept, `latest` when absent).
    pub fn with_digest(&self, digest: &str) -> String {
        format!(
            "{}/{}:{}@{digest}",
            self.0.kyverno_registry,
            self.0.kyverno_path,
            self.0.original_tag.as_deref().unwrap_or(DEFAULT_TAG)
        )
    }
}

impl std::fmt::Debug for ImageReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.0;
        f.debug_struct("ImageReference")
            .field("original", &p.original)
            .field("registry", &p.registry)
            .field("repository", &p.repository)
            .field("tag", &p.tag)
            .field("original_tag", &p.original_tag)
            .field("digest", &p.digest)
            .field("kyverno_registry", &p.kyverno_registry)
            .field("kyverno_path", &p.kyverno_path)
            .finish()
    }
}

impl std::fmt::Display for ImageReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.original)
    }
}

/// ggcr `NewTag` (weak): returns (repository part, tag-as-written-or-empty).
fn parse_tag(s: &str) -> std::result::Result<(&str, String), Reason> {
    let mut base = s;
    let mut tag = "";
    if let Some((b, t)) = s.rsplit_once(':') {
        // A ':' followed by a '/' belongs to a registry port, not a tag.
        if !t.contains('/') {
            if t.is_empty() {
                return Err(Reason::EmptyTag(s.to_owned()));
            }
            base = b;
            tag = t;
        }
    }
    if !tag.is_empty() {
        check_element("tag", tag, TAG_CHARS, 1, 128)?;
    }
    // Validate the repository here too so that `repo@sha256:…` falls through to the digest parser.
    split_repository(base)?;
    Ok((base, tag.to_owned()))
}

/// ggcr `NewDigest`: returns (repository part, tag written before '@', digest).
fn parse_digest(s: &str) -> std::result::Result<(&str, Option<String>, String), Reason> {
    let parts: Vec<&str> = s.split('@').collect();
    let [base, digest] = parts[..] else {
        return Err(Reason::DigestSeparator(s.to_owned()));
    };
    check_element("digest", digest, DIGEST_CHARS, 7 + 64, 7 + 64)?;
    if !digest.starts_with("sha256:") {
        return Err(Reason::DigestAlgorithm(digest.to_owned()));
    }
    // A tag before the digest is accepted (and validated) but not used by ggcr.
    match parse_tag(base) {
        Ok((repo, tag)) => Ok((repo, Some(tag).filter(|t| !t.is_empty()), digest.to_owned())),
        Err(_) => {
            split_repository(base)?;
            Ok((base, None, digest.to_owned()))
        }
    }
}

/// ggcr `NewRepository` + `NewRegistry`: returns (canonical registry, repository as written).
fn split_repository(name: &str) -> std::result::Result<(String, &str), Reason> {
    if name.is_empty() {
        return Err(Reason::MissingRepository);
    }
    let (registry, repo) = match name.split_once('/') {
        Some((first, rest)) if first.contains('.') || first.contains(':') => (first, rest),
        _ => ("", name),
    };
    check_element("repository", repo, REPOSITORY_CHARS, 2, 255)?;
    check_registry(registry)?;
    let registry = match registry {
        "" | KYVERNO_DEFAULT_REGISTRY => DEFAULT_REGISTRY.to_owned(),
        r => r.to_owned(),
    };
    Ok((registry, repo))
}

/// ggcr `checkRegistry`: must be a valid RFC 3986 authority (host[:port]).
fn check_registry(name: &str) -> std::result::Result<(), Reason> {
    let bad = || Reason::Registry(name.to_owned());
    if name.is_empty() {
        return Ok(());
    }
    let (host, port) = if name.starts_with('[') {
        match name.find(']') {
            Some(i) => (&name[..=i], name[i + 1..].strip_prefix(':')),
            None => return Err(bad()),
        }
    } else {
        match name.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (name, None),
        }
    };
    if host.len() + port.map_or(0, |p| p.len() + 1) != name.len() {
        return Err(bad());
    }
    if let Some(p) = port
        && !p.chars().all(|c| c.is_ascii_digit())
    {
        return Err(bad());
    }
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=%".contains(c))
    };
    if host_ok { Ok(()) } else { Err(bad()) }
}

fn check_element(
    what: &'static str,
    element: &str,
    allowed: &'static str,
    min: usize,
    max: usize,
) -> std::result::Result<(), Reason> {
    let n = element.chars().count();
    if n < min || n > max {
        return Err(Reason::Length {
            what,
            min,
            max,
            element: element.to_owned(),
        });
    }
    // `allowed` is ASCII: one table lookup per byte instead of a scan of `allowed` per char
    // (any non-ASCII byte is outside the table, hence refused, as before).
    let mut table = [false; 128];
    for b in allowed.bytes() {
        if let Some(slot) = table.get_mut(usize::from(b)) {
            *slot = true;
        }
    }
    if element
        .bytes()
        .any(|b| !table.get(usize::from(b)).copied().unwrap_or(false))
    {
        return Err(Reason::Characters {
            what,
            allowed,
            element: element.to_owned(),
        });
    }
    Ok(())
}

/// Kyverno `addDefaultRegistry` + docker distribution `Domain`/`Path` split (no `library/`).
fn kyverno_split(repo_part: &str) -> (String, String) {
    match repo_part.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first != first.to_lowercase() =>
        {
            (first.to_owned(), rest.to_owned())
        }
        _ => (KYVERNO_DEFAULT_REGISTRY.to_owned(), repo_part.to_owned()),
    }
}

#[cfg(test)]
mod tests;

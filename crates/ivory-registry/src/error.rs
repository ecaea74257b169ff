//! One error type for every registry operation. Each variant names the image and the
//! registry so a denial message can point at the right place.

use std::error::Error as StdError;
use std::time::Duration;

use ivory_reference::EgressRefusal;

use crate::cause::{AddressRefused, RedirectRefusal, TransportCause};
use crate::client::http::BodyError;
use crate::digest::DigestProblem;
use crate::operation::Operation;
use crate::stats::StatusClass;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Failure of a registry operation.
///
/// `Display` names the operation, the image, the registry and, where the registry answered,
/// the HTTP status and its class. It never contains text a registry sent (bodies, header
/// values, redirect targets): these messages reach the creator of a Pod, and a registry is
/// not theirs to speak through. What the registry said is logged (truncated) instead.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller's deadline passed before the registry answered.
    #[error(
        "{op} for image {image} on registry {registry} exceeded its deadline (budget {budget:?})"
    )]
    DeadlineExceeded {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// The budget the caller had.
        budget: Duration,
    },
    /// The manifest, blob, tag or repository does not exist.
    #[error("{op} for image {image} on registry {registry}: not found ({})", http(*status))]
    NotFound {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// The HTTP status the registry answered with.
        status: u16,
    },
    /// The registry refused the credentials (or asked for some and none were given).
    #[error("{op} for image {image} on registry {registry}: unauthorized ({})", http(*status))]
    Unauthorized {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// The HTTP status the registry answered with.
        status: u16,
    },
    /// A manifest, blob, token or other answer is larger than its limit; the read was
    /// aborted there.
    #[error("{what} of image {image} on registry {registry} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What was being read (manifest, blob, token answer, ...).
        what: &'static str,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// The limit, in bytes.
        limit: usize,
    },
    /// Every byte of the shared budget for registry answers being read was in use (other
    /// registries are sending large answers); transient.
    #[error(
        "{op} for image {image} on registry {registry}: too many large registry answers in flight"
    )]
    ReadBudgetExhausted {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
    },
    /// The registry kept answering 429/503 until no retry fitted in the deadline.
    #[error(
        "registry {registry} throttled or was unavailable for image {image} ({}) after {attempts} attempt(s)",
        http(*status)
    )]
    Throttled {
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// The HTTP status the registry answered with.
        status: u16,
        /// How many requests were made.
        attempts: u32,
    },
    /// The registry answered with a 5xx status.
    #[error("{op} for image {image} on registry {registry} failed ({})", http(*status))]
    Server {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// The HTTP status the registry answered with.
        status: u16,
    },
    /// Connection, TLS or protocol-level I/O failure (refused, reset, bad certificate).
    /// `cause` is read from the error's types; `detail` is the HTTP and TLS stack's text
    /// with URLs removed, for logs only.
    #[error("transport error during {op} for image {image} on registry {registry}: {detail}")]
    Transport {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// What failed, classified from the error chain's types.
        cause: TransportCause,
        /// The HTTP and TLS stack's description, for logs.
        detail: String,
    },
    /// The registry redirected too often, to a non-HTTP URL, or from HTTPS to plain HTTP.
    #[error("{op} for image {image} on registry {registry}: redirect refused ({reason})")]
    RedirectRefused {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// Why ivory refused it.
        reason: RedirectRefusal,
    },
    /// ivory's egress rule refused the address a connection would have gone to: the
    /// registry's host, a redirect target or a token realm, named by an address in any
    /// spelling or by a name that resolves there. No connection was made. Definite: the same
    /// request is refused again.
    #[error(
        "{op} for image {image} on registry {registry}: ivory refuses to connect to the {via}: {refusal}"
    )]
    EgressRefused {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// Which connection was refused.
        via: EgressVia,
        /// The address and why (the flag that would allow it included).
        refusal: EgressRefusal,
    },
    /// The registry's token realm is not usable without risking credentials: plain HTTP
    /// for a registry reached over TLS, or not an http(s) URL at all.
    #[error("registry {registry} (image {image}) names a token realm that ivory refuses: {reason}")]
    TokenRealmRefused {
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// Why ivory refused it.
        reason: &'static str,
    },
    /// The image reference does not parse.
    #[error("invalid image reference {image:?}: {detail}")]
    InvalidReference {
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// ivory's description of the failure.
        detail: String,
    },
    /// The manifest is malformed, of an unknown media type, or its index nesting is unsound.
    /// `detail` is ivory's own description.
    #[error("invalid manifest for image {image} on registry {registry}: {detail}")]
    InvalidManifest {
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// ivory's description of the failure.
        detail: String,
    },
    /// A digest sent by the registry (header, index entry, referrer) is not
    /// `sha256:` + 64 or `sha512:` + 128 lower-case hex characters.
    #[error("registry {registry} sent an invalid digest in {field} for image {image}: {problem}")]
    InvalidDigest {
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// Where the digest was found (header, index entry, referrer).
        field: &'static str,
        /// What is wrong with the digest.
        problem: DigestProblem,
    },
    /// Content does not hash to the digest that addressed it (or that the registry claimed).
    #[error(
        "digest mismatch for image {image} on registry {registry}: expected {expected}, got {actual}"
    )]
    DigestMismatch {
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// The digest that addressed the content.
        expected: String,
        /// The digest of the content received.
        actual: String,
    },
    /// Any other definite refusal (4xx, unexpected status) or malformed non-manifest answer.
    /// `detail` is ivory's own description.
    #[error("{op} for image {image} on registry {registry} was rejected: {detail}")]
    Rejected {
        /// What was being done.
        op: Operation,
        /// The image the operation was for.
        image: String,
        /// The registry host.
        registry: String,
        /// The HTTP status, when the registry answered with one.
        status: Option<u16>,
        /// ivory's description of the failure.
        detail: String,
    },
    /// Credentials (docker config.json or a dockerconfigjson secret) do not parse.
    #[error("invalid registry credentials in {source_name}: {detail}")]
    InvalidCredentials {
        /// The file or Secret the credentials came from.
        source_name: String,
        /// What does not parse.
        detail: String,
    },
    /// The registry client configuration is unusable (for example a bad CA bundle).
    #[error("invalid registry client configuration: {detail}")]
    Config {
        /// What is unusable.
        detail: String,
    },
}

/// Which connection of a registry call the egress rule refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressVia {
    /// The registry host of the image (or its mirror).
    Registry,
    /// A redirect the registry answered with.
    Redirect,
    /// The token realm the registry's challenge named.
    TokenRealm,
}

impl std::fmt::Display for EgressVia {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EgressVia::Registry => "registry host",
            EgressVia::Redirect => "registry's redirect target",
            EgressVia::TokenRealm => "registry's token realm",
        })
    }
}

/// `HTTP 404 (client error)`: the status and its class, nothing the registry wrote.
fn http(status: u16) -> String {
    let class = match status {
        100..=199 => "informational",
        200..=299 => "success",
        300..=399 => "redirect",
        400..=499 => "client error",
        500..=599 => "server error",
        _ => "non-standard status",
    };
    format!("HTTP {status}, {class}")
}

impl Error {
    /// True for failures that may succeed on retry (network, deadline, 5xx, 429, budget).
    /// Callers must never cache a transient error as a verdict.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::DeadlineExceeded { .. }
                | Error::Throttled { .. }
                | Error::Server { .. }
                | Error::Transport { .. }
                | Error::ReadBudgetExhausted { .. }
        )
    }

    /// How the registry answered the call that failed, for per-status counters.
    pub(crate) fn status_class(&self) -> StatusClass {
        match self {
            Error::NotFound { status, .. }
            | Error::Unauthorized { status, .. }
            | Error::Throttled { status, .. }
            | Error::Server { status, .. } => StatusClass::of_code(*status),
            Error::Rejected { status, .. } => {
                status.map_or(StatusClass::Client, StatusClass::of_code)
            }
            // The registry answered; the content or its follow-up was refused.
            Error::TooLarge { .. }
            | Error::ReadBudgetExhausted { .. }
            | Error::InvalidManifest { .. }
            | Error::InvalidDigest { .. }
            | Error::TokenRealmRefused { .. }
            | Error::RedirectRefused { .. }
            | Error::DigestMismatch { .. } => StatusClass::Success,
            Error::DeadlineExceeded { .. }
            | Error::Transport { .. }
            | Error::EgressRefused { .. }
            | Error::InvalidReference { .. }
            | Error::InvalidCredentials { .. }
            | Error::Config { .. } => StatusClass::NoAnswer,
        }
    }

    /// The HTTP status that makes this error retryable inside the deadline (429, 503).
    pub(crate) fn retry_status(&self) -> Option<u16> {
        match self {
            Error::Throttled { status, .. } => Some(*status),
            Error::Server { status: 503, .. } => Some(503),
            _ => None,
        }
    }
}

impl Error {
    /// One line for a person, without the image (the caller names it once): what failed,
    /// on which registry, and the root cause once, e.g. `cannot reach index.docker.io (DNS
    /// lookup failed)`. `Display` keeps the full form for logs.
    pub fn summary(&self) -> String {
        match self {
            Error::DeadlineExceeded {
                op,
                registry,
                budget,
                ..
            } => format!(
                "{registry} did not answer in time ({} within {budget:?})",
                op.target()
            ),
            Error::NotFound {
                op,
                registry,
                status,
                ..
            } => format!("{} not found on {registry} (HTTP {status})", op.target()),
            Error::Unauthorized {
                op,
                registry,
                status,
                ..
            } => format!(
                "{registry} refused access to the {} (HTTP {status}: missing or wrong credentials)",
                op.target()
            ),
            Error::TooLarge {
                what,
                registry,
                limit,
                ..
            } => format!("{what} from {registry} exceeds the limit of {limit} bytes"),
            Error::ReadBudgetExhausted { registry, .. } => {
                format!("{registry}: too many large registry answers in flight, try again")
            }
            Error::Throttled {
                registry,
                status,
                attempts,
                ..
            } => format!(
                "{registry} throttled or was unavailable (HTTP {status}) after {attempts} attempt(s)"
            ),
            Error::Server {
                op,
                registry,
                status,
                ..
            } => format!(
                "{registry} failed to serve the {} ({})",
                op.target(),
                http(*status)
            ),
            Error::Transport {
                registry,
                cause: TransportCause::Other,
                detail,
                ..
            } => format!("cannot reach {registry} ({})", innermost(detail)),
            Error::Transport {
                registry, cause, ..
            } => format!("cannot reach {registry} ({})", cause.describe()),
            Error::RedirectRefused {
                registry, reason, ..
            } => format!("{registry} redirected where ivory does not follow ({reason})"),
            Error::EgressRefused {
                registry,
                via,
                refusal,
                ..
            } => format!("{registry}: ivory refuses to connect to the {via}: {refusal}"),
            Error::TokenRealmRefused {
                registry, reason, ..
            } => format!("{registry} names a token realm that ivory refuses ({reason})"),
            Error::InvalidReference { detail, .. } => format!("invalid image reference ({detail})"),
            Error::InvalidManifest {
                registry, detail, ..
            } => format!("invalid manifest from {registry} ({detail})"),
            Error::InvalidDigest {
                registry,
                field,
                problem,
                ..
            } => format!("{registry} sent an invalid digest in {field} ({problem})"),
            Error::DigestMismatch {
                registry,
                expected,
                actual,
                ..
            } => format!(
                "content from {registry} does not match its digest {expected} (got {actual})"
            ),
            Error::Rejected {
                op,
                registry,
                detail,
                ..
            } => format!("{registry} rejected the {} request ({detail})", op.target()),
            Error::InvalidCredentials { .. } | Error::Config { .. } => self.to_string(),
        }
    }
}

/// The host of a `host[:port]` registry, as the resolver is asked for it.
fn host_of(registry: &str) -> &str {
    if registry.starts_with('[') {
        return registry;
    }
    registry.split(':').next().unwrap_or(registry)
}

/// The innermost layer of a transport error's text, where an unclassified cause is named.
fn innermost(detail: &str) -> &str {
    detail.rsplit(": ").next().unwrap_or(detail).trim()
}

/// Where an error happened, used to fill in the error's names.
#[derive(Clone, Copy)]
pub(crate) struct Site<'a> {
    pub op: Operation,
    pub image: &'a str,
    pub registry: &'a str,
}

impl Site<'_> {
    fn image(&self) -> String {
        self.image.to_string()
    }
    fn registry(&self) -> String {
        self.registry.to_string()
    }

    pub(crate) fn deadline(&self, budget: Duration) -> Error {
        Error::DeadlineExceeded {
            op: self.op,
            image: self.image(),
            registry: self.registry(),
            budget,
        }
    }

    pub(crate) fn invalid_manifest(&self, detail: impl Into<String>) -> Error {
        Error::InvalidManifest {
            image: self.image(),
            registry: self.registry(),
            detail: detail.into(),
        }
    }

    pub(crate) fn too_large(&self, what: &'static str, limit: usize) -> Error {
        Error::TooLarge {
            what,
            image: self.image(),
            registry: self.registry(),
            limit,
        }
    }

    pub(crate) fn digest_mismatch(&self, expected: &str, actual: &str) -> Error {
        Error::DigestMismatch {
            image: self.image(),
            registry: self.registry(),
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }

    pub(crate) fn rejected(&self, status: Option<u16>, detail: impl Into<String>) -> Error {
        Error::Rejected {
            op: self.op,
            image: self.image(),
            registry: self.registry(),
            status,
            detail: detail.into(),
        }
    }

    /// A digest the registry sent, checked for form; `field` names where it came from.
    pub(crate) fn checked_digest(&self, field: &'static str, digest: &str) -> Result<()> {
        crate::digest::validate(digest).map_err(|problem| {
            tracing::warn!(
                registry = %self.registry, image = %self.image, field,
                digest = %truncate(digest), %problem, "registry sent an invalid digest"
            );
            Error::InvalidDigest {
                image: self.image(),
                registry: self.registry(),
                field,
                problem,
            }
        })
    }

    pub(crate) fn token_realm(&self, reason: &'static str) -> Error {
        Error::TokenRealmRefused {
            image: self.image(),
            registry: self.registry(),
            reason,
        }
    }

    /// A body read that stopped early.
    pub(crate) fn body(&self, what: &'static str, limit: usize, e: BodyError) -> Error {
        match e {
            BodyError::TooLarge => {
                tracing::warn!(registry = %self.registry, image = %self.image, what, limit,
                    "registry answer over its limit; read aborted");
                self.too_large(what, limit)
            }
            BodyError::BudgetExhausted => Error::ReadBudgetExhausted {
                op: self.op,
                image: self.image(),
                registry: self.registry(),
            },
            BodyError::Transport(e) => self.transport(e),
        }
    }

    /// A reqwest failure: a refused redirect, or a transport error classified by the types
    /// in its chain, its text kept without URLs (a redirect target is the registry's text).
    pub(crate) fn transport(&self, e: reqwest::Error) -> Error {
        self.transport_via(e, EgressVia::Redirect)
    }

    /// As [`Site::transport`]; an egress refusal of a host other than the registry's is
    /// blamed on `other` (a redirect target, or the token realm).
    pub(crate) fn transport_via(&self, e: reqwest::Error, other: EgressVia) -> Error {
        let e = e.without_url();
        if let Some(refused) = AddressRefused::of(&e) {
            let via = if host_of(self.registry).eq_ignore_ascii_case(&refused.host) {
                EgressVia::Registry
            } else {
                other
            };
            return self.egress(via, refused.refusal());
        }
        let detail = chain(&e);
        if let Some(reason) = RedirectRefusal::of(&e) {
            tracing::warn!(registry = %self.registry, image = %self.image, op = self.op.as_str(),
                error = %detail, "registry redirect refused");
            return Error::RedirectRefused {
                op: self.op,
                image: self.image(),
                registry: self.registry(),
                reason,
            };
        }
        Error::Transport {
            op: self.op,
            image: self.image(),
            registry: self.registry(),
            cause: TransportCause::of(&e),
            detail,
        }
    }

    /// The egress rule refused the `via` connection.
    pub(crate) fn egress(&self, via: EgressVia, refusal: EgressRefusal) -> Error {
        tracing::warn!(registry = %self.registry, image = %self.image, op = self.op.as_str(),
            %via, ip = %refusal.ip, class = %refusal.class, "connection refused by the egress rule");
        Error::EgressRefused {
            op: self.op,
            image: self.image(),
            registry: self.registry(),
            via,
            refusal,
        }
    }

    /// A non-2xx answer: classified by status alone; `snippet` (the start of the body) goes
    /// to the log only.
    pub(crate) fn by_status(&self, code: u16, snippet: &str) -> Error {
        tracing::info!(registry = %self.registry, image = %self.image, op = self.op.as_str(),
            status = code, body = %truncate(snippet), "registry refused a request");
        let (op, image, registry) = (self.op, self.image(), self.registry());
        match code {
            404 => Error::NotFound {
                op,
                image,
                registry,
                status: code,
            },
            401 | 403 => Error::Unauthorized {
                op,
                image,
                registry,
                status: code,
            },
            429 => Error::Throttled {
                image,
                registry,
                status: 429,
                attempts: 1,
            },
            500..=599 => Error::Server {
                op,
                image,
                registry,
                status: code,
            },
            _ => self.rejected(Some(code), http(code)),
        }
    }
}

/// Joins an error with its sources: reqwest hides the TLS cause ("invalid peer
/// certificate: UnknownIssuer") behind "error sending request" otherwise.
fn chain(err: &dyn StdError) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

/// Registry text (bodies, header values) for the log: bounded, on a char boundary.
pub(crate) fn truncate(s: &str) -> String {
    const MAX: usize = 300;
    if s.len() <= MAX {
        return s.trim().to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", s[..end].trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> Site<'static> {
        Site {
            op: Operation::FetchManifest,
            image: "r.example/app:1",
            registry: "r.example",
        }
    }

    #[test]
    fn status_codes_map_to_definite_or_transient_variants() {
        let s = site();
        assert!(matches!(s.by_status(404, "x"), Error::NotFound { .. }));
        assert!(!s.by_status(404, "x").is_transient());
        assert!(matches!(s.by_status(403, "x"), Error::Unauthorized { .. }));
        assert!(s.by_status(429, "x").is_transient());
        assert_eq!(s.by_status(429, "x").retry_status(), Some(429));
        assert_eq!(s.by_status(503, "x").retry_status(), Some(503));
        assert_eq!(s.by_status(500, "x").retry_status(), None);
        assert!(s.by_status(500, "x").is_transient());
        assert!(!s.by_status(400, "x").is_transient());
    }

    #[test]
    fn messages_name_registry_operation_and_status_class_but_never_the_body() {
        let secret = "SECRET-FROM-REGISTRY <html>";
        for code in [400, 401, 403, 404, 418, 429, 500, 502, 503] {
            let msg = site().by_status(code, secret).to_string();
            assert!(!msg.contains("SECRET"), "{msg}");
            assert!(msg.contains("r.example"), "{msg}");
            assert!(msg.contains(&format!("HTTP {code}")), "{msg}");
            if code != 429 {
                assert!(msg.contains("fetch_manifest"), "{msg}");
            }
        }
        assert!(
            site()
                .by_status(404, "")
                .to_string()
                .contains("client error")
        );
        assert!(
            site()
                .by_status(502, "")
                .to_string()
                .contains("server error")
        );
    }

    #[test]
    fn invalid_digests_are_named_without_echoing_them() {
        let bad = format!("sha256:{}", "A".repeat(64));
        let err = site()
            .checked_digest("Docker-Content-Digest", &bad)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidDigest {
                problem: DigestProblem::NotLowerHex,
                ..
            }
        ));
        let msg = err.to_string();
        assert!(
            msg.contains("Docker-Content-Digest") && !msg.contains("AAAA"),
            "{msg}"
        );
        assert!(!err.is_transient());
    }

    #[test]
    fn summaries_are_one_line_with_the_root_cause_once_and_no_image() {
        let dns = Error::Transport {
            op: Operation::ResolveDigest,
            image: "docker.io/busybox:1.36".into(),
            registry: "index.docker.io".into(),
            cause: TransportCause::DnsLookupFailed,
            detail: "error sending request: client error (Connect): dns error: failed to lookup \
                     address information: Temporary failure in name resolution"
                .into(),
        };
        assert_eq!(
            dns.summary(),
            "cannot reach index.docker.io (DNS lookup failed)"
        );
        let tls = Error::Transport {
            op: Operation::FetchManifest,
            image: "127.0.0.1:5000/a:1".into(),
            registry: "127.0.0.1:5000".into(),
            cause: TransportCause::CertificateUnknownIssuer,
            detail: "error sending request: client error (Connect): invalid peer certificate: UnknownIssuer".into(),
        };
        assert_eq!(
            tls.summary(),
            "cannot reach 127.0.0.1:5000 (TLS certificate signed by an unknown authority)"
        );
        assert_eq!(
            site().by_status(404, "").summary(),
            "manifest not found on r.example (HTTP 404)"
        );
        for code in [401, 403, 404, 418, 429, 500, 503] {
            let line = site().by_status(code, "SECRET").summary();
            assert!(
                !line.contains('\n') && !line.contains("r.example/app:1"),
                "{line}"
            );
            assert!(
                !line.contains("SECRET") && line.contains("r.example"),
                "{line}"
            );
        }
        let unknown = Error::Transport {
            op: Operation::FetchBlob,
            image: "r.example/app:1".into(),
            registry: "r.example".into(),
            cause: TransportCause::Other,
            detail: "a: b: something new".into(),
        };
        assert_eq!(unknown.summary(), "cannot reach r.example (something new)");
    }

    #[test]
    fn long_bodies_are_truncated_on_char_boundaries() {
        let body = "é".repeat(400);
        let t = truncate(&body);
        assert!(t.len() < 320);
        assert!(t.ends_with('…'));
    }
}

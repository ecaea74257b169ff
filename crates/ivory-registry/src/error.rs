//! One error type for every registry operation. Each variant names the image and the
//! registry so a denial message can point at the right place.

use std::error::Error as StdError;
use std::time::Duration;

use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};

use crate::stats::StatusClass;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Failure of a registry operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller's deadline passed before the registry answered.
    #[error(
        "{op} for image {image} on registry {registry} exceeded its deadline (budget {budget:?})"
    )]
    DeadlineExceeded {
        op: &'static str,
        image: String,
        registry: String,
        budget: Duration,
    },
    /// The manifest, blob, tag or repository does not exist.
    #[error("image {image} not found on registry {registry}: {detail}")]
    NotFound {
        image: String,
        registry: String,
        detail: String,
    },
    /// The registry refused the credentials (or asked for some and none were given).
    #[error("unauthorized to read image {image} on registry {registry}: {detail}")]
    Unauthorized {
        image: String,
        registry: String,
        detail: String,
    },
    /// A manifest or blob is larger than the configured limit.
    #[error("{what} of image {image} on registry {registry} exceeds the limit of {limit} bytes")]
    TooLarge {
        what: &'static str,
        image: String,
        registry: String,
        limit: usize,
    },
    /// The registry kept answering 429/503 until no retry fitted in the deadline.
    #[error(
        "registry {registry} throttled or was unavailable for image {image} (HTTP {status}) after {attempts} attempt(s)"
    )]
    Throttled {
        image: String,
        registry: String,
        status: u16,
        attempts: u32,
    },
    /// The registry answered with a 5xx status.
    #[error("registry {registry} failed for image {image} with HTTP {status}: {detail}")]
    Server {
        image: String,
        registry: String,
        status: u16,
        detail: String,
    },
    /// Connection, TLS or protocol-level I/O failure (refused, reset, bad certificate).
    #[error("transport error reaching registry {registry} for image {image}: {detail}")]
    Transport {
        image: String,
        registry: String,
        detail: String,
    },
    /// The image reference does not parse.
    #[error("invalid image reference {image:?}: {detail}")]
    InvalidReference {
        image: String,
        registry: String,
        detail: String,
    },
    /// The manifest is malformed, of an unknown media type, or its index nesting is unsound.
    #[error("invalid manifest for image {image} on registry {registry}: {detail}")]
    InvalidManifest {
        image: String,
        registry: String,
        detail: String,
    },
    /// Content does not hash to the digest that addressed it.
    #[error(
        "digest mismatch for image {image} on registry {registry}: expected {expected}, got {actual}"
    )]
    DigestMismatch {
        image: String,
        registry: String,
        expected: String,
        actual: String,
    },
    /// Any other definite refusal (4xx) or malformed non-manifest answer.
    #[error("registry {registry} rejected the request for image {image}: {detail}")]
    Rejected {
        image: String,
        registry: String,
        status: Option<u16>,
        detail: String,
    },
    /// Credentials (docker config.json or a dockerconfigjson secret) do not parse.
    #[error("invalid registry credentials in {source_name}: {detail}")]
    InvalidCredentials { source_name: String, detail: String },
    /// The registry client configuration is unusable (for example a bad CA bundle).
    #[error("invalid registry client configuration: {detail}")]
    Config { detail: String },
}

impl Error {
    /// True for failures that may succeed on retry (network, deadline, 5xx, 429).
    /// Callers must never cache a transient error as a verdict.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::DeadlineExceeded { .. }
                | Error::Throttled { .. }
                | Error::Server { .. }
                | Error::Transport { .. }
        )
    }

    /// How the registry answered the call that failed, for per-status counters.
    pub(crate) fn status_class(&self) -> StatusClass {
        match self {
            Error::NotFound { .. } | Error::Unauthorized { .. } => StatusClass::Client,
            Error::Rejected { status, .. } => {
                status.map_or(StatusClass::Client, StatusClass::of_code)
            }
            Error::Throttled { status, .. } | Error::Server { status, .. } => {
                StatusClass::of_code(*status)
            }
            // The registry answered 2xx; the content was refused.
            Error::TooLarge { .. }
            | Error::InvalidManifest { .. }
            | Error::DigestMismatch { .. } => StatusClass::Success,
            Error::DeadlineExceeded { .. }
            | Error::Transport { .. }
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

/// Where an oci-client error happened, used to fill in the error's names.
pub(crate) struct Site<'a> {
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

    pub(crate) fn deadline(&self, op: &'static str, budget: Duration) -> Error {
        Error::DeadlineExceeded {
            op,
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

    pub(crate) fn transport(&self, detail: impl Into<String>) -> Error {
        Error::Transport {
            image: self.image(),
            registry: self.registry(),
            detail: detail.into(),
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
            image: self.image(),
            registry: self.registry(),
            status,
            detail: detail.into(),
        }
    }

    /// Classifies an oci-client error into a definite or transient variant.
    pub(crate) fn classify(&self, err: OciDistributionError) -> Error {
        let (image, registry) = (self.image(), self.registry());
        match err {
            OciDistributionError::RequestError(e) => self.transport(chain(&e)),
            OciDistributionError::IoError(e) => self.transport(chain(&e)),
            OciDistributionError::UnauthorizedError { url } => Error::Unauthorized {
                image,
                registry,
                detail: format!("HTTP 401 from {url}"),
            },
            OciDistributionError::AuthenticationFailure(reason) => Error::Unauthorized {
                image,
                registry,
                detail: format!("token request failed: {}", truncate(&reason)),
            },
            OciDistributionError::ImageManifestNotFoundError(detail) => Error::NotFound {
                image,
                registry,
                detail,
            },
            OciDistributionError::RegistryError { envelope, url } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                let detail = format!("{} ({url})", truncate(&envelope.to_string()));
                self.by_codes(&codes, detail)
            }
            OciDistributionError::ServerError { code, url, message } => {
                let detail = format!("{} ({url})", truncate(&message));
                self.by_status(code, detail)
            }
            OciDistributionError::DigestError(DigestError::VerificationError {
                expected,
                actual,
            }) => self.digest_mismatch(&expected, &actual),
            e @ (OciDistributionError::DigestError(_)
            | OciDistributionError::ManifestParsingError(_)
            | OciDistributionError::VersionedParsingError(_)
            | OciDistributionError::UnsupportedMediaTypeError(_)
            | OciDistributionError::UnsupportedSchemaVersionError(_)
            | OciDistributionError::ManifestEncodingError(_)
            | OciDistributionError::SpecViolationError(_)) => self.invalid_manifest(e.to_string()),
            other => self.rejected(None, other.to_string()),
        }
    }

    fn by_codes(&self, codes: &[&OciErrorCode], detail: String) -> Error {
        let (image, registry) = (self.image(), self.registry());
        let has = |c: &OciErrorCode| codes.contains(&c);
        if has(&OciErrorCode::Toomanyrequests) {
            Error::Throttled {
                image,
                registry,
                status: 429,
                attempts: 1,
            }
        } else if has(&OciErrorCode::Unauthorized) || has(&OciErrorCode::Denied) {
            Error::Unauthorized {
                image,
                registry,
                detail,
            }
        } else if has(&OciErrorCode::ManifestUnknown)
            || has(&OciErrorCode::BlobUnknown)
            || has(&OciErrorCode::NameUnknown)
            || has(&OciErrorCode::NotFound)
            || has(&OciErrorCode::ManifestBlobUnknown)
        {
            Error::NotFound {
                image,
                registry,
                detail,
            }
        } else {
            self.rejected(None, detail)
        }
    }

    pub(crate) fn by_status(&self, code: u16, detail: String) -> Error {
        let (image, registry) = (self.image(), self.registry());
        match code {
            404 => Error::NotFound {
                image,
                registry,
                detail,
            },
            401 | 403 => Error::Unauthorized {
                image,
                registry,
                detail,
            },
            429 => Error::Throttled {
                image,
                registry,
                status: 429,
                attempts: 1,
            },
            500..=599 => Error::Server {
                image,
                registry,
                status: code,
                detail,
            },
            _ => self.rejected(Some(code), detail),
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

/// Registry error bodies can be arbitrary HTML; keep messages readable.
fn truncate(s: &str) -> String {
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
            image: "r.example/app:1",
            registry: "r.example",
        }
    }

    #[test]
    fn status_codes_map_to_definite_or_transient_variants() {
        let s = site();
        assert!(matches!(
            s.by_status(404, "x".into()),
            Error::NotFound { .. }
        ));
        assert!(!s.by_status(404, "x".into()).is_transient());
        assert!(matches!(
            s.by_status(403, "x".into()),
            Error::Unauthorized { .. }
        ));
        assert!(s.by_status(429, "x".into()).is_transient());
        assert_eq!(s.by_status(429, "x".into()).retry_status(), Some(429));
        assert_eq!(s.by_status(503, "x".into()).retry_status(), Some(503));
        assert_eq!(s.by_status(500, "x".into()).retry_status(), None);
        assert!(s.by_status(500, "x".into()).is_transient());
        assert!(!s.by_status(400, "x".into()).is_transient());
    }

    #[test]
    fn envelope_codes_are_classified() {
        let envelope: oci_client::errors::OciEnvelope = serde_json::from_str(
            r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#,
        )
        .unwrap();
        let err = site().classify(OciDistributionError::RegistryError {
            envelope,
            url: "u".into(),
        });
        assert!(matches!(err, Error::Throttled { status: 429, .. }));

        let envelope: oci_client::errors::OciEnvelope =
            serde_json::from_str(r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"no"}]}"#)
                .unwrap();
        let err = site().classify(OciDistributionError::RegistryError {
            envelope,
            url: "u".into(),
        });
        assert!(matches!(err, Error::NotFound { .. }));
        assert!(err.to_string().contains("r.example/app:1"));
    }

    #[test]
    fn digest_verification_error_is_a_mismatch() {
        let err = site().classify(OciDistributionError::DigestError(
            DigestError::VerificationError {
                expected: "sha256:a".into(),
                actual: "sha256:b".into(),
            },
        ));
        assert!(matches!(err, Error::DigestMismatch { .. }));
        assert!(!err.is_transient());
    }

    #[test]
    fn long_bodies_are_truncated_on_char_boundaries() {
        let body = "é".repeat(400);
        let t = truncate(&body);
        assert!(t.len() < 320);
        assert!(t.ends_with('…'));
    }
}

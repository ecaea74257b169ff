//! The one place where registry errors become the engine's typed [`VerifyError`]s. Every
//! decision downstream (failurePolicy, metrics, exit codes, messages) follows the variant
//! chosen here, never the text.

use ivory_engine::verifier::{ImageReference, VerifyError};
use ivory_registry::Error as RegistryError;
use tokio::time::Instant;

/// Classifies `e`, met while doing `operation` for `image`. A failure that arrives after the
/// caller's `deadline` counts as the budget running out, whatever caused it.
pub(crate) fn map_error(
    image: &ImageReference,
    operation: &str,
    e: RegistryError,
    deadline: Instant,
) -> VerifyError {
    use RegistryError as E;
    let registry = registry_of(&e);
    let budget = match &e {
        E::DeadlineExceeded { budget, .. } => Some(*budget),
        _ if ivory_clock::now() >= deadline => Some(std::time::Duration::ZERO),
        _ => None,
    };
    if let Some(budget) = budget {
        return deadline_error(image, operation, budget);
    }
    // People read the one-line summary; the full chain goes to the debug log.
    tracing::debug!(%image, operation, error = %e, "registry call failed");
    let message = e.summary();
    let (image, registry) = (image.original().to_owned(), registry.clone());
    match e {
        E::NotFound { .. } => VerifyError::NotFound {
            image,
            registry,
            message,
        },
        // A definite refusal of what was read (or of the reference itself): never an
        // availability problem, so never subject to failurePolicy Ignore.
        E::TooLarge { .. }
        | E::InvalidManifest { .. }
        | E::InvalidDigest { .. }
        | E::DigestMismatch { .. }
        | E::RedirectRefused { .. }
        | E::EgressRefused { .. }
        | E::TokenRealmRefused { .. }
        | E::InvalidReference { .. } => VerifyError::Hostile {
            image,
            registry,
            message,
        },
        // Network, TLS, 5xx, throttling, a full read budget, refused credentials, other 4xx,
        // local configuration: no answer about the image could be had.
        E::Unauthorized { .. }
        | E::ReadBudgetExhausted { .. }
        | E::Throttled { .. }
        | E::Server { .. }
        | E::Transport { .. }
        | E::Rejected { .. }
        | E::InvalidCredentials { .. }
        | E::Config { .. }
        | E::DeadlineExceeded { .. } => VerifyError::Unavailable {
            image,
            registry,
            message,
        },
    }
}

/// A caller's own deadline passed while it waited for a (possibly shared) load.
pub(crate) fn deadline_error(
    image: &ImageReference,
    operation: &str,
    budget: std::time::Duration,
) -> VerifyError {
    VerifyError::deadline_exceeded(image, operation, budget)
}

fn registry_of(e: &RegistryError) -> String {
    use RegistryError as E;
    match e {
        E::DeadlineExceeded { registry, .. }
        | E::NotFound { registry, .. }
        | E::Unauthorized { registry, .. }
        | E::TooLarge { registry, .. }
        | E::ReadBudgetExhausted { registry, .. }
        | E::RedirectRefused { registry, .. }
        | E::EgressRefused { registry, .. }
        | E::TokenRealmRefused { registry, .. }
        | E::InvalidDigest { registry, .. }
        | E::Throttled { registry, .. }
        | E::Server { registry, .. }
        | E::Transport { registry, .. }
        | E::InvalidReference { registry, .. }
        | E::InvalidManifest { registry, .. }
        | E::DigestMismatch { registry, .. }
        | E::Rejected { registry, .. } => registry.clone(),
        E::InvalidCredentials { .. } | E::Config { .. } => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ivory_engine::verifier::ErrorKind;

    use super::*;

    const IMAGE: &str = "reg.example/app:1";

    fn reference() -> ImageReference {
        ImageReference::parse(IMAGE).unwrap()
    }

    fn later() -> Instant {
        ivory_clock::now() + Duration::from_secs(60)
    }

    fn kind(e: RegistryError, deadline: Instant) -> ErrorKind {
        map_error(&reference(), "resolving the digest", e, deadline).kind()
    }

    fn at(detail: &str) -> (String, String, String) {
        (IMAGE.into(), "reg.example".into(), detail.into())
    }

    /// One registry error of each variant, and its kind.
    fn registry_error_cases() -> Vec<(RegistryError, ErrorKind)> {
        let (image, registry, detail) = at("x");
        vec![
            (
                RegistryError::DeadlineExceeded {
                    op: ivory_registry::Operation::ResolveDigest,
                    image: image.clone(),
                    registry: registry.clone(),
                    budget: Duration::from_millis(1500),
                },
                ErrorKind::Deadline,
            ),
            (
                RegistryError::NotFound {
                    op: ivory_registry::Operation::FetchManifest,
                    image: image.clone(),
                    registry: registry.clone(),
                    status: 404,
                },
                ErrorKind::NotFound,
            ),
            (
                RegistryError::TooLarge {
                    what: "manifest",
                    image: image.clone(),
                    registry: registry.clone(),
                    limit: 10,
                },
                ErrorKind::Hostile,
            ),
            (
                RegistryError::InvalidManifest {
                    image: image.clone(),
                    registry: registry.clone(),
                    detail: detail.clone(),
                },
                ErrorKind::Hostile,
            ),
            (
                RegistryError::DigestMismatch {
                    image: image.clone(),
                    registry: registry.clone(),
                    expected: "sha256:a".into(),
                    actual: "sha256:b".into(),
                },
                ErrorKind::Hostile,
            ),
            (
                RegistryError::Server {
                    op: ivory_registry::Operation::FetchManifest,
                    image: image.clone(),
                    registry: registry.clone(),
                    status: 503,
                },
                ErrorKind::Unavailable,
            ),
            (
                RegistryError::Transport {
                    op: ivory_registry::Operation::FetchManifest,
                    image: image.clone(),
                    registry: registry.clone(),
                    cause: ivory_registry::TransportCause::ConnectionReset,
                    detail: detail.clone(),
                },
                ErrorKind::Unavailable,
            ),
            (
                RegistryError::ReadBudgetExhausted {
                    op: ivory_registry::Operation::FetchManifest,
                    image: image.clone(),
                    registry: registry.clone(),
                },
                ErrorKind::Unavailable,
            ),
            (
                RegistryError::InvalidDigest {
                    image: image.clone(),
                    registry: registry.clone(),
                    field: "Docker-Content-Digest",
                    problem: ivory_registry::DigestProblem::NotLowerHex,
                },
                ErrorKind::Hostile,
            ),
            (
                RegistryError::RedirectRefused {
                    op: ivory_registry::Operation::FetchManifest,
                    image: image.clone(),
                    registry: registry.clone(),
                    reason: ivory_registry::RedirectRefusal::TooMany,
                },
                ErrorKind::Hostile,
            ),
            (
                RegistryError::EgressRefused {
                    op: ivory_registry::Operation::FetchManifest,
                    image: image.clone(),
                    registry: registry.clone(),
                    via: ivory_registry::EgressVia::Redirect,
                    refusal: ivory_registry::EgressRule::default()
                        .judge("169.254.169.254".parse().unwrap())
                        .unwrap_err(),
                },
                ErrorKind::Hostile,
            ),
            (
                RegistryError::TokenRealmRefused {
                    image: image.clone(),
                    registry: registry.clone(),
                    reason: "plain HTTP realm",
                },
                ErrorKind::Hostile,
            ),
            (
                RegistryError::Unauthorized {
                    op: ivory_registry::Operation::FetchManifest,
                    image: image.clone(),
                    registry: registry.clone(),
                    status: 401,
                },
                ErrorKind::Unavailable,
            ),
        ]
    }

    #[test]
    fn registry_errors_are_classified_by_variant() {
        let mut failures = ivory_testkit::cases::Failures::new();
        for (error, expected) in registry_error_cases() {
            let text = error.to_string();
            failures.check_eq(&text, "kind", kind(error, later()), expected);
        }
        failures.assert_none();
    }

    #[test]
    fn the_budget_is_read_from_the_variant_not_the_text() {
        let (image, registry, _) = at("");
        let mapped = map_error(
            &reference(),
            "resolving the digest",
            RegistryError::DeadlineExceeded {
                op: ivory_registry::Operation::ResolveDigest,
                image,
                registry,
                budget: Duration::from_millis(1500),
            },
            later(),
        );
        assert!(matches!(
            mapped,
            VerifyError::DeadlineExceeded {
                budget_ms: 1500,
                ..
            }
        ));
        assert_eq!(mapped.registry(), "reg.example");
        // A transport failure whose text mentions a budget is still an unavailable registry.
        let (image, registry, _) = at("");
        let sneaky = RegistryError::Transport {
            op: ivory_registry::Operation::FetchManifest,
            image,
            registry,
            cause: ivory_registry::TransportCause::Other,
            detail: "time budget of 1ms exhausted".into(),
        };
        assert_eq!(kind(sneaky, later()), ErrorKind::Unavailable);
    }

    #[test]
    fn any_failure_after_the_deadline_is_a_spent_budget() {
        let (image, registry, detail) = at("reset");
        let past = ivory_clock::now();
        let e = RegistryError::Transport {
            op: ivory_registry::Operation::FetchManifest,
            image,
            registry,
            cause: ivory_registry::TransportCause::TimedOut,
            detail,
        };
        assert_eq!(kind(e, past), ErrorKind::Deadline);
    }
}

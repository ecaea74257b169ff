//! A legacy `keyless` identity (`subject`, `subjectRegExp`, `issuer`, `issuerRegExp`,
//! `additionalExtensions`) as ImageValidatingPolicy `identities[]`.
//!
//! Kyverno v1.19 checks them itself after cosign verified the signature
//! (`pkg/image/verifiers/cpol/cosign/cosign.go`, `matchCertificateData` and `matchExtensions`):
//! `subject` and `issuer` are wildcard patterns (`ext/wildcard`: `*` any run, `?` one
//! character); the subject passes when `subject` **or** `subjectRegExp` matches; the issuer
//! passes when `issuer` **and** `issuerRegExp` match; extension values are wildcards too. An
//! ImageValidatingPolicy identity matches exact values or regexps (cosign's rule: a regexp, when
//! present, replaces the exact value), and its identities are alternatives, so the OR becomes
//! two identities and a wildcard an anchored regexp.

use ivory_policy::types::Identity;
use regex::Regex;

use super::error::ConvertError;
use super::images::{has_wildcard, wildcard_to_regex};
use super::model;

/// One side of an identity: an exact value or a regexp.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Side {
    exact: Option<String>,
    reg_exp: Option<String>,
}

impl Side {
    /// A Kyverno wildcard pattern: exact when it has no wildcard, else its anchored regexp.
    fn wildcard(pattern: &str) -> Self {
        if has_wildcard(pattern) {
            Self {
                exact: None,
                reg_exp: Some(wildcard_to_regex(pattern)),
            }
        } else {
            Self {
                exact: Some(pattern.to_owned()),
                reg_exp: None,
            }
        }
    }

    fn reg_exp(expression: &str) -> Self {
        Self {
            exact: None,
            reg_exp: Some(expression.to_owned()),
        }
    }
}

/// The value of an optional field, when set and not empty.
fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|s| !s.is_empty())
}

/// The identities a legacy keyless entry accepts (never empty; no constraint at all is the
/// caller's case). `at` is the entry's field path.
pub(crate) fn identities(
    keyless: &model::Keyless,
    at: &str,
) -> Result<Vec<Identity>, ConvertError> {
    let subject = non_empty(&keyless.subject);
    let subject_reg_exp = non_empty(&keyless.subject_reg_exp);
    if let Some(expression) = subject_reg_exp {
        check_reg_exp(expression, &format!("{at}.subjectRegExp"))?;
    }
    // Either matching is enough: one identity each.
    let mut subjects: Vec<Side> = subject.map(Side::wildcard).into_iter().collect();
    subjects.extend(subject_reg_exp.map(Side::reg_exp));
    if subjects.is_empty() {
        subjects.push(Side::default());
    }
    let issuer = issuer_side(
        non_empty(&keyless.issuer),
        non_empty(&keyless.issuer_reg_exp),
        at,
    )?;
    Ok(subjects
        .into_iter()
        .map(|subject| Identity {
            issuer: issuer.exact.clone(),
            subject: subject.exact,
            issuer_reg_exp: issuer.reg_exp.clone(),
            subject_reg_exp: subject.reg_exp,
            subject_expression: None,
        })
        .collect())
}

/// `issuer` and `issuerRegExp` must both match. With a plain `issuer` that is one exact value
/// (when the regexp accepts it); a wildcard `issuer` beside a regexp would need two regexps on
/// one side, which an identity cannot hold.
fn issuer_side(
    issuer: Option<&str>,
    issuer_reg_exp: Option<&str>,
    at: &str,
) -> Result<Side, ConvertError> {
    let field = format!("{at}.issuerRegExp");
    let Some(expression) = issuer_reg_exp else {
        return Ok(issuer.map(Side::wildcard).unwrap_or_default());
    };
    let compiled = check_reg_exp(expression, &field)?;
    let Some(issuer) = issuer else {
        return Ok(Side::reg_exp(expression));
    };
    if has_wildcard(issuer) {
        return Err(ConvertError::unsupported(
            field,
            "Kyverno requires both the wildcard issuer and issuerRegExp to match; an \
             ImageValidatingPolicy identity holds one issuer pattern (write their intersection \
             as issuerRegExp alone)",
        ));
    }
    if !compiled.is_match(issuer) {
        return Err(ConvertError::invalid(
            field,
            format!(
                "issuerRegExp does not match issuer {issuer:?}; Kyverno requires both, so no \
                 certificate can ever match this entry"
            ),
        ));
    }
    Ok(Side::wildcard(issuer))
}

/// `expression` compiles (Kyverno reports an invalid regexp only when a signature arrives;
/// the converter says so at once).
fn check_reg_exp(expression: &str, field: &str) -> Result<Regex, ConvertError> {
    Regex::new(expression).map_err(|e| {
        ConvertError::invalid(field, format!("{expression:?} is not a valid regexp: {e}"))
    })
}

/// `additionalExtensions` values are wildcards in Kyverno; an identity's extension values are
/// exact, so a value with a wildcard is refused rather than matched literally (which would deny
/// what Kyverno admits).
pub(crate) fn check_extensions(keyless: &model::Keyless, at: &str) -> Result<(), ConvertError> {
    let extensions = keyless.additional_extensions.iter().flatten();
    for (key, value) in extensions {
        if has_wildcard(value) {
            return Err(ConvertError::unsupported(
                format!("{at}.additionalExtensions.{key}"),
                format!(
                    "value {value:?} is a wildcard pattern in Kyverno; ImageValidatingPolicy \
                     extension values are matched exactly"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyless(subject: &str, subject_re: &str, issuer: &str, issuer_re: &str) -> model::Keyless {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        model::Keyless {
            subject: some(subject),
            subject_reg_exp: some(subject_re),
            issuer: some(issuer),
            issuer_reg_exp: some(issuer_re),
            ..model::Keyless::default()
        }
    }

    /// Whether any converted identity accepts (subject, issuer), as the verifier's rule does:
    /// a regexp replaces the exact value, an empty side accepts anything.
    fn accepts(identities: &[Identity], subject: &str, issuer: &str) -> bool {
        let side = |exact: &Option<String>, re: &Option<String>, value: &str| match (re, exact) {
            (Some(r), _) => Regex::new(r).unwrap().is_match(value),
            (None, Some(e)) => e == value,
            (None, None) => true,
        };
        identities.iter().any(|i| {
            side(&i.subject, &i.subject_reg_exp, subject)
                && side(&i.issuer, &i.issuer_reg_exp, issuer)
        })
    }

    const GITHUB: &str = "https://token.actions.githubusercontent.com";
    const WORKFLOW: &str = "https://github.com/org/repo/.github/workflows/release.yaml@refs/tags/v";

    #[test]
    fn wildcard_subjects_and_issuers_match_as_kyverno_matches_them() {
        struct Case {
            name: &'static str,
            entry: model::Keyless,
            subject: String,
            issuer: &'static str,
            accepted: bool,
        }
        let wildcard = keyless(&format!("{WORKFLOW}*"), "", GITHUB, "");
        let cases = [
            Case {
                name: "a tag the wildcard covers",
                entry: wildcard.clone(),
                subject: format!("{WORKFLOW}1.2.3"),
                issuer: GITHUB,
                accepted: true,
            },
            Case {
                name: "another workflow",
                entry: wildcard.clone(),
                subject: "https://github.com/org/repo/.github/workflows/other.yaml@refs/tags/v1"
                    .into(),
                issuer: GITHUB,
                accepted: false,
            },
            Case {
                name: "dots are literal, not regexp wildcards",
                entry: wildcard.clone(),
                subject: format!("{WORKFLOW}1").replace("release.yaml", "releaseXyaml"),
                issuer: GITHUB,
                accepted: false,
            },
            Case {
                name: "another issuer",
                entry: wildcard,
                subject: format!("{WORKFLOW}1"),
                issuer: "https://accounts.google.com",
                accepted: false,
            },
            Case {
                name: "? is one character",
                entry: keyless("dev?@example.com", "", "https://*.example.com", ""),
                subject: "dev1@example.com".into(),
                issuer: "https://login.example.com",
                accepted: true,
            },
            Case {
                name: "? is not zero characters",
                entry: keyless("dev?@example.com", "", "", ""),
                subject: "dev@example.com".into(),
                issuer: GITHUB,
                accepted: false,
            },
            Case {
                name: "subject or subjectRegExp: the regexp alone",
                entry: keyless("alice@example.com", "^bob@", "", ""),
                subject: "bob@example.com".into(),
                issuer: GITHUB,
                accepted: true,
            },
            Case {
                name: "subject or subjectRegExp: the subject alone",
                entry: keyless("alice@example.com", "^bob@", "", ""),
                subject: "alice@example.com".into(),
                issuer: GITHUB,
                accepted: true,
            },
            Case {
                name: "issuer and issuerRegExp: both hold",
                entry: keyless("", "", GITHUB, "githubusercontent"),
                subject: "anyone".into(),
                issuer: GITHUB,
                accepted: true,
            },
        ];
        let mut failures = Vec::new();
        for case in &cases {
            let converted = identities(&case.entry, "e.keyless").unwrap();
            if accepts(&converted, &case.subject, case.issuer) != case.accepted {
                failures.push(format!("{}: {converted:?}", case.name));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn a_plain_subject_stays_exact_and_the_or_is_two_identities() {
        let one = identities(&keyless("alice@example.com", "", GITHUB, ""), "e").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].subject.as_deref(), Some("alice@example.com"));
        assert_eq!(one[0].issuer.as_deref(), Some(GITHUB));
        let two = identities(&keyless("a*", "^b", "", ""), "e").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].subject_reg_exp.as_deref(), Some("^a.*$"));
    }

    #[test]
    fn issuers_that_cannot_both_match_and_bad_regexps_are_refused_naming_the_field() {
        let never = identities(&keyless("", "", GITHUB, "^https://gitlab"), "e.keyless");
        let wildcard_and_re = identities(&keyless("", "", "https://*", "github"), "e.keyless");
        let bad = identities(&keyless("", "(", "", ""), "e.keyless");
        for (result, field) in [
            (never, "e.keyless.issuerRegExp"),
            (wildcard_and_re, "e.keyless.issuerRegExp"),
            (bad, "e.keyless.subjectRegExp"),
        ] {
            let e = result.unwrap_err();
            assert_eq!(e.path.field(), field, "{e}");
        }
    }

    #[test]
    fn wildcard_extension_values_are_refused() {
        let mut entry = keyless("a", "", GITHUB, "");
        entry.additional_extensions = Some(
            [("githubWorkflowRepository".to_owned(), "org/*".to_owned())]
                .into_iter()
                .collect(),
        );
        let e = check_extensions(&entry, "e.keyless").unwrap_err();
        assert_eq!(
            e.path.field(),
            "e.keyless.additionalExtensions.githubWorkflowRepository"
        );
        entry.additional_extensions = Some(
            [("githubWorkflowRepository".to_owned(), "org/repo".to_owned())]
                .into_iter()
                .collect(),
        );
        assert!(check_extensions(&entry, "e.keyless").is_ok());
    }
}

//! ivory's Notation trust-policy extension: the parts of the Notary Project trust policy that
//! Kyverno's `notary` attestor has no field for (verification level, per-check overrides,
//! `trustedIdentities`, which trust store the attestor's `certs` are). They are given in the
//! policy annotation [`NOTATION_TRUST_POLICY_ANNOTATION`] (the API server prunes fields Kyverno's
//! CRD does not declare from `spec`, never annotations), a JSON object from attestor name to
//! [`NotationTrustPolicy`]:
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     ivory.dev/notation-trust-policy: |
//!       {"notary": {"level": "permissive",
//!                   "override": {"expiry": "enforce", "revocation": "log"},
//!                   "verifyTimestamp": "afterCertExpiry",
//!                   "trustedIdentities": ["x509.subject: C=US, O=Acme, CN=release"]}}
//! ```
//!
//! Everything is checked at load: an unknown attestor, a cosign attestor, an unknown key or
//! value, the `skip` level and an override of `integrity` keep the policy from loading.
//! Revocation (`strict`'s default, or an override) is judged from CRLs ivory fetches in the
//! background, never while admitting (`ivory_verify::notation::revocation`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The policy annotation carrying [`NotationTrustPolicy`]s by attestor name.
pub const NOTATION_TRUST_POLICY_ANNOTATION: &str = "ivory.dev/notation-trust-policy";

/// The Notary Project trust-policy knobs for one `notary` attestor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotationTrustPolicy {
    /// `signatureVerification.level`; `strict` (Kyverno's) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<Level>,
    /// `signatureVerification.override`: a check's action instead of the level's.
    #[serde(
        default,
        rename = "override",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub overrides: BTreeMap<Check, Action>,
    /// `trustedIdentities`: `*` or `x509.subject: <DN>` entries; the signing certificate's
    /// subject must hold every attribute of one of them. Absent or empty: any identity
    /// (Kyverno's `["*"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_identities: Vec<String>,
    /// Which trust store the attestor's `certs` are: `ca` (Kyverno's) for `notary.x509`
    /// signatures, or `signingAuthority` for `notary.x509.signingAuthority` ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certs_trust_store: Option<TrustStore>,
    /// `signatureVerification.verifyTimestamp`: when a timestamp countersignature is looked at
    /// (with `tsaCerts`); `always` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_timestamp: Option<VerifyTimestamp>,
}

/// notation's `verifyTimestamp` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum VerifyTimestamp {
    /// The timestamp is always verified (and required) when `tsaCerts` are given.
    Always,
    /// Only once a certificate of the chain has expired; until then the chain must be valid
    /// at verification time and no timestamp is needed.
    AfterCertExpiry,
}

/// A verification level of the Notary Project trust policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Level {
    /// Every check enforced.
    #[default]
    Strict,
    /// Authentic timestamp, expiry and revocation only logged.
    Permissive,
    /// Only integrity enforced; authenticity too is only logged.
    Audit,
    /// No verification: refused at load (leave the attestor out instead).
    Skip,
}

/// A validation of the Notary Project trust policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Check {
    /// The signature verifies and covers the image (never overridable).
    Integrity,
    /// The certificate chain leads to the trust store and a trusted identity.
    Authenticity,
    /// The certificates were valid at a trusted time (timestamp, signing authority, or now).
    AuthenticTimestamp,
    /// The signature's own expiry has not passed.
    Expiry,
    /// The certificates are not revoked (judged from CRLs fetched in the background).
    Revocation,
}

/// What a failed check does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// Fails the verification.
    Enforce,
    /// Logged (a warning), the verification goes on.
    Log,
    /// Not performed.
    Skip,
}

/// What the attestor's `certs` are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TrustStore {
    /// Certificate authorities of `notary.x509` signatures.
    Ca,
    /// Signing authorities of `notary.x509.signingAuthority` signatures.
    SigningAuthority,
}

impl Level {
    /// The action of `check` at this level (the specification's table).
    pub fn action(self, check: Check) -> Action {
        match (self, check) {
            (Self::Skip, _) => Action::Skip,
            (_, Check::Integrity) | (Self::Strict, _) => Action::Enforce,
            (Self::Permissive, Check::Authenticity) => Action::Enforce,
            (Self::Audit | Self::Permissive, _) => Action::Log,
        }
    }
}

impl NotationTrustPolicy {
    /// The action for `check`: the override, else the level's.
    pub fn action(&self, check: Check) -> Action {
        self.overrides
            .get(&check)
            .copied()
            .unwrap_or_else(|| self.level.unwrap_or_default().action(check))
    }

    /// Problems that keep the policy from loading, with the key they are about.
    pub(crate) fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.level == Some(Level::Skip) {
            out.push((
                "level".into(),
                "\"skip\" would admit any image: leave the attestor out instead".into(),
            ));
        }
        if self.overrides.contains_key(&Check::Integrity) {
            out.push((
                "override.integrity".into(),
                "integrity is always enforced".into(),
            ));
        }
        for (i, identity) in self.trusted_identities.iter().enumerate() {
            if let Err(e) = TrustedIdentity::parse(identity) {
                out.push((format!("trustedIdentities[{i}]"), e.to_string()));
            }
        }
        out
    }
}

/// One `trustedIdentities` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrustedIdentity {
    /// `*`: any signing certificate.
    Any,
    /// `x509.subject: <DN>`: attributes (short names such as `C`, `O`, `CN`) the signing
    /// certificate's subject must hold with these values.
    Subject(DistinguishedName),
}

/// A distinguished name as attribute (short name, upper case: `C`, `O`, `CN`) → value.
pub type DistinguishedName = BTreeMap<String, String>;

impl TrustedIdentity {
    /// Parses `*` or `x509.subject: C=US, O=Acme, CN=release` (no escaped commas or
    /// multi-valued attributes; an attribute named twice is refused).
    pub fn parse(text: &str) -> Result<Self, TrustedIdentityError> {
        if text.trim() == "*" {
            return Ok(Self::Any);
        }
        let Some(dn) = text.trim().strip_prefix("x509.subject:") else {
            return Err(TrustedIdentityError::NotAnIdentity {
                entry: text.to_owned(),
            });
        };
        Ok(Self::Subject(parse_dn(dn)?))
    }
}

/// Why a `trustedIdentities` entry is refused; the text is the policy error's reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrustedIdentityError {
    /// Neither `*` nor an `x509.subject:` entry.
    #[error("{entry:?}: expected \"*\" or \"x509.subject: <distinguished name>\"")]
    NotAnIdentity {
        /// The entry as written.
        entry: String,
    },
    /// An `x509.subject:` entry whose distinguished name is refused.
    #[error(transparent)]
    Subject(#[from] DnError),
}

/// Why a distinguished name is not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DnError {
    /// A backslash or a `+`: escaping and multi-valued attributes are not read, so the name
    /// would be split wrongly.
    #[error("{dn:?}: escaped characters and multi-valued attributes are not supported")]
    Unsupported {
        /// The name as written.
        dn: String,
    },
    /// A comma-separated part without an attribute, an `=` or a value.
    #[error("{dn:?}: {part:?} is not attribute=value")]
    NotAttributeValue {
        /// The name as written.
        dn: String,
        /// The part, as written between commas.
        part: String,
    },
    /// The same attribute twice: which value to require would be ambiguous.
    #[error("{dn:?}: {attribute} is given twice")]
    Repeated {
        /// The name as written.
        dn: String,
        /// The attribute, upper-cased.
        attribute: String,
    },
}

/// `C=US, O=Acme, CN=release` as attribute → value (never empty: an empty name has one empty
/// part, which is not attribute=value).
pub fn parse_dn(dn: &str) -> Result<DistinguishedName, DnError> {
    if dn.contains('\\') || dn.contains('+') {
        return Err(DnError::Unsupported { dn: dn.to_owned() });
    }
    let mut out = BTreeMap::new();
    for part in dn.split(',') {
        let not_attribute_value = || DnError::NotAttributeValue {
            dn: dn.to_owned(),
            part: part.to_owned(),
        };
        let (k, v) = part.split_once('=').ok_or_else(not_attribute_value)?;
        let (k, v) = (k.trim().to_ascii_uppercase(), v.trim());
        if k.is_empty() || v.is_empty() {
            return Err(not_attribute_value());
        }
        if out.insert(k.clone(), v.to_owned()).is_some() {
            return Err(DnError::Repeated {
                dn: dn.to_owned(),
                attribute: k,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_the_specification_table() {
        use Action::*;
        use Check::*;
        let row = |l: Level| {
            [
                Integrity,
                Authenticity,
                AuthenticTimestamp,
                Expiry,
                Revocation,
            ]
            .map(|c| l.action(c))
        };
        assert_eq!(row(Level::Strict), [Enforce; 5]);
        assert_eq!(row(Level::Permissive), [Enforce, Enforce, Log, Log, Log]);
        assert_eq!(row(Level::Audit), [Enforce, Log, Log, Log, Log]);
        let p = NotationTrustPolicy {
            level: Some(Level::Permissive),
            overrides: [(Expiry, Enforce)].into(),
            ..Default::default()
        };
        assert_eq!(p.action(Expiry), Enforce);
        assert_eq!(p.action(AuthenticTimestamp), Log);
    }

    #[test]
    fn identities_parse_and_bad_ones_are_named() {
        assert_eq!(TrustedIdentity::parse("*"), Ok(TrustedIdentity::Any));
        let TrustedIdentity::Subject(dn) =
            TrustedIdentity::parse("x509.subject: C=US, O=ivory tests, CN=x").unwrap()
        else {
            panic!("subject expected");
        };
        assert_eq!(dn.get("O").map(String::as_str), Some("ivory tests"));
        for bad in [
            "CN=x",
            "x509.subject: CN",
            "x509.subject: C=US, C=DE",
            "x509.subject: CN=a\\,b",
        ] {
            assert!(TrustedIdentity::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refused_identities_say_why_in_the_policy_error_words() {
        let why = |text: &str| TrustedIdentity::parse(text).unwrap_err().to_string();
        assert_eq!(
            why("CN=x"),
            r#""CN=x": expected "*" or "x509.subject: <distinguished name>""#
        );
        assert_eq!(
            why("x509.subject: CN=a\\,b"),
            r#"" CN=a\\,b": escaped characters and multi-valued attributes are not supported"#
        );
        assert_eq!(
            why("x509.subject: C=US, CN"),
            r#"" C=US, CN": " CN" is not attribute=value"#
        );
        assert_eq!(why("x509.subject:"), r#""": "" is not attribute=value"#);
        assert_eq!(
            why("x509.subject: c=US, C=DE"),
            r#"" c=US, C=DE": C is given twice"#
        );
        assert_eq!(
            parse_dn("O=a+b"),
            Err(DnError::Unsupported { dn: "O=a+b".into() })
        );
    }

    #[test]
    fn refused_settings_are_named() {
        let p: NotationTrustPolicy = serde_json::from_str(
            r#"{"level":"skip","override":{"integrity":"log","revocation":"enforce"},"trustedIdentities":["nope"]}"#,
        )
        .unwrap();
        let keys: Vec<String> = p.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            ["level", "override.integrity", "trustedIdentities[0]"]
        );
        let p: NotationTrustPolicy = serde_json::from_str(
            r#"{"override":{"revocation":"log"},"verifyTimestamp":"afterCertExpiry"}"#,
        )
        .unwrap();
        assert!(p.problems().is_empty());
        assert_eq!(p.action(Check::Revocation), Action::Log);
        assert_eq!(p.verify_timestamp, Some(VerifyTimestamp::AfterCertExpiry));
        assert!(
            serde_json::from_str::<NotationTrustPolicy>(r#"{"verifyTimestamp":"never"}"#).is_err()
        );
        assert!(serde_json::from_str::<NotationTrustPolicy>(r#"{"levle":"strict"}"#).is_err());
        assert!(serde_json::from_str::<NotationTrustPolicy>(r#"{"level":"lax"}"#).is_err());
    }
}

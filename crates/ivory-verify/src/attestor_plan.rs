//! An attestor turned into what verification needs: the authority (key, certificate or keyless
//! identities), the sigstore-verify `Verifier` built from its trust material, and its flags.
//! Building a plan does no IO; failures are definite verdicts about the policy's attestor.

use std::collections::BTreeMap;
use std::sync::Arc;

use ivory_policy::types::{Attestor, Cosign, Identity, Keyless};
use regex::Regex;
use sigstore_verify::Verifier;
use sigstore_verify::crypto::CertificateInfo;
use sigstore_verify::trust_root::TrustedRoot;
use sigstore_verify::types::DerCertificate;

use crate::keys::{PublicKey, certificate_key, parse_certificates, parse_public_key};
use crate::rejection::Rejection;
use crate::trust::verifier_for;
use crate::trust_source::RootState;

/// `key.kms` without `key.data`.
pub const KMS_UNSUPPORTED: &str = "KMS keys are not supported by ivory";

/// Who may have signed.
#[derive(Debug)]
pub(crate) enum Authority {
    /// `key.data`.
    Key(PublicKey),
    /// `certificate.cert` (and `certChain`, checked against the cert).
    Certificate(PublicKey),
    /// `keyless.identities` (any rule may match) and `keyless.additionalExtensions`.
    Keyless(KeylessRules),
    /// A `notary` attestor: Notation signatures, never cosign ones.
    Notary(Box<crate::notation::NotaryPlan>),
}

/// What a keyless signing certificate must show.
#[derive(Debug)]
pub(crate) struct KeylessRules {
    /// Any one of these must match the certificate's subject and issuer.
    pub(crate) identities: Vec<IdentityRule>,
    /// Every one of these Fulcio extensions must hold exactly this value.
    pub(crate) extensions: Vec<(GithubClaim, String)>,
}

/// The Fulcio GitHub workflow extensions `keyless.additionalExtensions` may constrain
/// (`1.3.6.1.4.1.57264.1.2` to `.6`, the ones cosign's `CheckOpts` compares), by the key names
/// Kyverno's `additionalExtensions` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GithubClaim {
    Trigger,
    Sha,
    Name,
    Repository,
    Ref,
}

impl GithubClaim {
    fn from_key(key: &str) -> Option<Self> {
        Some(match key {
            "githubWorkflowTrigger" => Self::Trigger,
            "githubWorkflowSha" => Self::Sha,
            "githubWorkflowName" => Self::Name,
            "githubWorkflowRepository" => Self::Repository,
            "githubWorkflowRef" => Self::Ref,
            _ => return None,
        })
    }

    fn key(self) -> &'static str {
        match self {
            Self::Trigger => "githubWorkflowTrigger",
            Self::Sha => "githubWorkflowSha",
            Self::Name => "githubWorkflowName",
            Self::Repository => "githubWorkflowRepository",
            Self::Ref => "githubWorkflowRef",
        }
    }

    fn value(self, info: &CertificateInfo) -> Option<&str> {
        let gh = &info.ci_claims.deprecated_github;
        match self {
            Self::Trigger => gh.workflow_trigger.as_deref(),
            Self::Sha => gh.workflow_sha.as_deref(),
            Self::Name => gh.workflow_name.as_deref(),
            Self::Repository => gh.workflow_repository.as_deref(),
            Self::Ref => gh.workflow_ref.as_deref(),
        }
    }
}

impl KeylessRules {
    fn new(keyless: &Keyless) -> Result<Self, Rejection> {
        if keyless.identities.is_empty() {
            return Err(Rejection::Attestor(
                "keyless attestor needs at least one identity".into(),
            ));
        }
        let identities = keyless
            .identities
            .iter()
            .enumerate()
            .map(|(i, id)| IdentityRule::new(id, i))
            .collect::<Result<_, _>>()?;
        let extensions = keyless
            .additional_extensions
            .iter()
            .map(|(k, v)| {
                let claim = GithubClaim::from_key(k).ok_or_else(|| {
                    Rejection::Attestor(format!(
                        "keyless.additionalExtensions.{k} is not supported"
                    ))
                })?;
                let value = v.as_str().ok_or_else(|| {
                    Rejection::Attestor(format!(
                        "keyless.additionalExtensions.{k} must be a string"
                    ))
                })?;
                Ok((claim, value.to_owned()))
            })
            .collect::<Result<_, Rejection>>()?;
        Ok(Self {
            identities,
            extensions,
        })
    }

    /// The certificate names an accepted identity and carries every required extension value.
    pub(crate) fn check(&self, info: &CertificateInfo) -> Result<(), Rejection> {
        let subject = info
            .identity
            .as_ref()
            .map(|i| i.as_str())
            .unwrap_or_default();
        let issuer = info.issuer.as_deref().unwrap_or_default();
        if !self.identities.iter().any(|r| r.matches(subject, issuer)) {
            return Err(Rejection::Identity {
                subject: subject.to_owned(),
                issuer: issuer.to_owned(),
            });
        }
        for (claim, want) in &self.extensions {
            let got = claim.value(info);
            if got != Some(want.as_str()) {
                return Err(Rejection::Certificate(format!(
                    "certificate extension {} is {}, expected {want:?}",
                    claim.key(),
                    got.map_or_else(|| "absent".to_owned(), |g| format!("{g:?}")),
                )));
            }
        }
        Ok(())
    }
}

/// One `keyless.identities[]` entry with its regexps compiled.
#[derive(Debug)]
pub(crate) struct IdentityRule {
    issuer: Option<String>,
    issuer_re: Option<Regex>,
    subject: Option<String>,
    subject_re: Option<Regex>,
    /// The evaluated `subjectExpression`: one more exact subject the certificate must name.
    subject_from_expression: Option<String>,
}

impl IdentityRule {
    fn new(identity: &Identity, index: usize) -> Result<Self, Rejection> {
        let compile = |re: &Option<String>, field: &str| {
            re.as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| {
                    Regex::new(s).map_err(|e| {
                        Rejection::Attestor(format!(
                            "keyless.identities[{index}].{field} is not a valid regexp: {e}"
                        ))
                    })
                })
                .transpose()
        };
        let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        Ok(Self {
            issuer: non_empty(&identity.issuer),
            issuer_re: compile(&identity.issuer_reg_exp, "issuerRegExp")?,
            subject: non_empty(&identity.subject),
            subject_re: compile(&identity.subject_reg_exp, "subjectRegExp")?,
            subject_from_expression: non_empty(&identity.subject_expression),
        })
    }

    /// cosign's `CheckCertificatePolicy`: the regexp (unanchored) wins over the exact value,
    /// and a side with neither places no constraint. The evaluated `subjectExpression`
    /// constrains the subject on top of that (the engine has written its value in place of the
    /// expression before the attestor reaches the verifier).
    pub(crate) fn matches(&self, subject: &str, issuer: &str) -> bool {
        let ok = |exact: &Option<String>, re: &Option<Regex>, value: &str| match (re, exact) {
            (Some(r), _) => r.is_match(value),
            (None, Some(e)) => e == value,
            (None, None) => true,
        };
        let from_expression = self
            .subject_from_expression
            .as_deref()
            .is_none_or(|s| s == subject);
        from_expression
            && ok(&self.subject, &self.subject_re, subject)
            && ok(&self.issuer, &self.issuer_re, issuer)
    }
}

/// A ready-to-use attestor.
pub struct Plan {
    pub(crate) authority: Authority,
    /// `None` for key/certificate attestors with `insecureIgnoreTlog` (no Sigstore trust at all).
    pub(crate) verifier: Option<Arc<Verifier>>,
    /// Certificate authorities of the trust root (keyless signatures without log entries).
    pub(crate) ca_certs: Vec<DerCertificate>,
    /// The trust root itself (legacy Rekor entry kinds); `None` when `verifier` is.
    pub(crate) trusted_root: Option<Arc<TrustedRoot>>,
    /// Where the trust root came from, for a denial naming a log it does not know.
    pub(crate) trust_described: Arc<str>,
    pub(crate) ignore_tlog: bool,
    pub(crate) ignore_sct: bool,
    pub(crate) annotations: BTreeMap<String, String>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("authority", &self.authority)
            .field("has_trust_root", &self.verifier.is_some())
            .field("ignore_tlog", &self.ignore_tlog)
            .field("ignore_sct", &self.ignore_sct)
            .field("annotations", &self.annotations)
            .finish()
    }
}

impl Plan {
    /// Builds the plan for `attestor`; `Err` is the NotVerified reason.
    pub fn new(attestor: &Attestor, default_root: &RootState) -> Result<Self, Rejection> {
        Self::build(attestor, default_root, false)
    }

    /// [`Plan::new`], keeping the trust root even for a key without the log: a blob's bundle
    /// (`blob`) has its timestamps checked whatever the log flag says.
    pub fn with_trust_root(
        attestor: &Attestor,
        default_root: &RootState,
    ) -> Result<Self, Rejection> {
        Self::build(attestor, default_root, true)
    }

    fn build(
        attestor: &Attestor,
        default_root: &RootState,
        keep_trust: bool,
    ) -> Result<Self, Rejection> {
        let Some(cosign) = &attestor.cosign else {
            return match &attestor.notary {
                Some(notary) => Ok(Self::notary(crate::notation::NotaryPlan::new(notary)?)),
                None => Err(Rejection::Attestor(format!(
                    "attestor {} has neither cosign nor notary",
                    attestor.name
                ))),
            };
        };
        let ctlog = cosign.ctlog.clone().unwrap_or_default();
        let ignore_tlog = ctlog.insecure_ignore_tlog.unwrap_or(false);
        let ignore_sct = ctlog.insecure_ignore_sct.unwrap_or(false);
        let authority = authority(cosign)?;
        let needs_trust = keep_trust || matches!(authority, Authority::Keyless(_)) || !ignore_tlog;
        let (verifier, ca_certs, trusted_root, trust_described) = if needs_trust {
            let trust = verifier_for(cosign, default_root)?;
            (
                Some(trust.verifier),
                trust.ca_certs,
                Some(trust.root),
                trust.described,
            )
        } else {
            (None, Vec::new(), None, Arc::from("no trust root"))
        };
        Ok(Self {
            authority,
            verifier,
            ca_certs,
            trusted_root,
            trust_described,
            ignore_tlog,
            ignore_sct,
            annotations: cosign.annotations.clone(),
        })
    }
}

impl Plan {
    /// A notary attestor's plan: no Sigstore trust at all.
    fn notary(plan: crate::notation::NotaryPlan) -> Self {
        Self {
            authority: Authority::Notary(Box::new(plan)),
            verifier: None,
            ca_certs: Vec::new(),
            trust_described: Arc::from("no trust root"),
            trusted_root: None,
            ignore_tlog: true,
            ignore_sct: true,
            annotations: BTreeMap::new(),
        }
    }
}

/// Kyverno's precedence: keyless, then key (data before kms), then certificate.
fn authority(cosign: &Cosign) -> Result<Authority, Rejection> {
    if let Some(keyless) = &cosign.keyless {
        return KeylessRules::new(keyless).map(Authority::Keyless);
    }
    if let Some(key) = &cosign.key {
        if let Some(data) = key.data.as_deref().filter(|d| !d.trim().is_empty()) {
            return parse_public_key(data, key.hash_algorithm.as_deref()).map(Authority::Key);
        }
        if key.kms.as_deref().is_some_and(|k| !k.is_empty()) {
            return Err(Rejection::Attestor(KMS_UNSUPPORTED.into()));
        }
    }
    if let Some(cert) = &cosign.certificate {
        let text = cert
            .cert
            .as_ref()
            .and_then(|s| s.value.as_deref())
            .unwrap_or_default();
        let leaf = first_cert(text, "certificate.cert")?;
        if let Some(chain) = cert.cert_chain.as_ref().and_then(|s| s.value.as_deref()) {
            let chain = parse_certificates(chain, "certificate.certChain")?;
            crate::chain::verify_chain(&leaf, &chain)?;
        }
        return certificate_key(&leaf).map(Authority::Certificate);
    }
    Err(Rejection::Attestor(
        "cosign verifier needs to have one key, keyless or certificate fields set".into(),
    ))
}

fn first_cert(text: &str, field: &str) -> Result<DerCertificate, Rejection> {
    parse_certificates(text, field)?
        .into_iter()
        .next()
        .ok_or_else(|| Rejection::Attestor(format!("{field} holds no certificate")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_policy::types::{CosignKey, Notary};

    fn cosign(c: Cosign) -> Attestor {
        Attestor {
            name: "a".into(),
            cosign: Some(c),
            notary: None,
        }
    }

    #[test]
    fn unsupported_and_empty_attestors_are_named() {
        let notary = Attestor {
            name: "n".into(),
            cosign: None,
            notary: Some(Notary::default()),
        };
        assert_eq!(
            Plan::new(&notary, &RootState::embedded())
                .unwrap_err()
                .to_string(),
            "notary.certs holds no certificate"
        );
        let kms = cosign(Cosign {
            key: Some(CosignKey {
                kms: Some("awskms:///x".into()),
                ..CosignKey::default()
            }),
            ..Cosign::default()
        });
        assert_eq!(
            Plan::new(&kms, &RootState::embedded())
                .unwrap_err()
                .to_string(),
            KMS_UNSUPPORTED
        );
        let empty = cosign(Cosign::default());
        assert!(
            Plan::new(&empty, &RootState::embedded())
                .unwrap_err()
                .to_string()
                .contains("one key")
        );
    }

    #[test]
    fn keyless_rules_match_exact_and_regexp() {
        let ids = vec![
            Identity {
                issuer: Some("https://github.com/login/oauth".into()),
                subject_reg_exp: Some(r"@example\.com$".into()),
                ..Identity::default()
            },
            Identity {
                issuer_reg_exp: Some("token.actions".into()),
                subject: Some("https://x/y".into()),
                ..Identity::default()
            },
        ];
        let plan = Plan::new(
            &cosign(Cosign {
                keyless: Some(Keyless {
                    identities: ids,
                    ..Keyless::default()
                }),
                ..Cosign::default()
            }),
            &RootState::embedded(),
        )
        .unwrap();
        let Authority::Keyless(rules) = &plan.authority else {
            panic!("keyless expected")
        };
        let any = |s: &str, i: &str| rules.identities.iter().any(|r| r.matches(s, i));
        assert!(any("me@example.com", "https://github.com/login/oauth"));
        assert!(!any("me@example.org", "https://github.com/login/oauth"));
        assert!(any(
            "https://x/y",
            "https://token.actions.githubusercontent.com"
        ));
        assert!(!any(
            "https://x/y/z",
            "https://token.actions.githubusercontent.com"
        ));
    }

    #[test]
    fn bad_regexp_is_named() {
        let bad = |id: Identity| {
            Plan::new(
                &cosign(Cosign {
                    keyless: Some(Keyless {
                        identities: vec![id],
                        ..Keyless::default()
                    }),
                    ..Cosign::default()
                }),
                &RootState::embedded(),
            )
            .unwrap_err()
            .to_string()
        };
        let e = bad(Identity {
            subject_reg_exp: Some("(".into()),
            issuer: Some("i".into()),
            ..Identity::default()
        });
        assert!(e.contains("subjectRegExp"), "{e}");
    }
}

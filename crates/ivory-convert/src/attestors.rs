//! Legacy attestor sets (`attestors[].entries[]` with `count`) as ImageValidatingPolicy
//! attestors plus the count each set needs (`verifyImageSignatures(image, [..]) >= count`).
//!
//! Kyverno's cosign options per entry (`pkg/engine/internal/imageverifier.go`
//! `buildCosignVerifier`): no `rekor` means the public Rekor (`https://rekor.sigstore.dev`) with
//! the transparency log required; `rekor.ignoreTlog` skips it; `ctlog.ignoreSCT`, `ctlog.pubkey`
//! and `ctlog.tsaCertChain` map one to one. A `keys.publicKeys` holding several PEM keys is one
//! entry per key (`ExpandStaticKeys`), and `count` then counts keys.

use std::collections::BTreeMap;

use super::context::ConfigMaps;
use super::error::ConvertError;
use super::identity;
use super::model::{self, AttestorSet, CtLog, Rekor};
use ivory_policy::types::{
    Attestor, Cosign, CosignCertificate, CosignKey, Ctlog, Identity, Keyless, Notary, Source,
    StringSource,
};

/// The public Rekor Kyverno's legacy verifier uses when an attestor names none.
const PUBLIC_REKOR: &str = "https://rekor.sigstore.dev";

/// One attestor set: the attestors' names and how many of them must verify.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SetCheck {
    pub names: Vec<String>,
    pub count: usize,
}

/// Rule-level settings every attestor inherits (`repository`, `annotations`, `type`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Inherited {
    pub repository: Option<String>,
    pub annotations: Option<BTreeMap<String, String>>,
    pub notary: bool,
    /// Expand multi-key `publicKeys` into one entry per key (signatures: yes; attestations:
    /// Kyverno does not, so such an entry is refused there).
    pub expand_keys: bool,
    /// The rule's ConfigMap `context` entries, which a key may be read from.
    pub config_maps: ConfigMaps,
}

/// Converted attestor sets.
#[derive(Debug, Default)]
pub(crate) struct Converted {
    pub attestors: Vec<Attestor>,
    pub checks: Vec<SetCheck>,
    pub differences: Vec<String>,
}

/// Converts `sets` (at `field`, e.g. `attestors`) naming attestors `<prefix>s<i>e<j>`.
pub(crate) fn convert_sets(
    sets: &[AttestorSet],
    field: &str,
    prefix: &str,
    inherited: &Inherited,
    out: &mut Converted,
) -> Result<(), ConvertError> {
    for (i, set) in sets.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let mut names = Vec::new();
        for (j, entry) in set.entries.iter().enumerate() {
            let entry_at = format!("{at}.entries[{j}]");
            let converted = convert_entry(entry, &entry_at, inherited, &mut out.differences)?;
            let many = converted.len() > 1;
            for (k, attestor) in converted.into_iter().enumerate() {
                let name = if many {
                    format!("{prefix}s{i}e{j}k{k}")
                } else {
                    format!("{prefix}s{i}e{j}")
                };
                names.push(name.clone());
                out.attestors.push(Attestor { name, ..attestor });
            }
        }
        if names.is_empty() {
            return Err(ConvertError::invalid(
                format!("{at}.entries"),
                "An entry is required",
            ));
        }
        let count_at = format!("{at}.count");
        let count = match set.count {
            None | Some(0) => names.len(),
            Some(n) if n < 0 => return Err(ConvertError::invalid(count_at, "must be at least 1")),
            Some(n) => {
                usize::try_from(n).map_err(|_| ConvertError::invalid(&*count_at, "too large"))?
            }
        };
        if count > names.len() {
            return Err(ConvertError::invalid(
                count_at,
                format!(
                    "Count cannot exceed length of entries ({count} > {})",
                    names.len()
                ),
            ));
        }
        out.checks.push(SetCheck { names, count });
    }
    Ok(())
}

/// One attestor entry (`<at>`, `attestors[i].entries[j]`) as one attestor, or one per key
/// of a multi-key `publicKeys`.
fn convert_entry(
    entry: &model::Attestor,
    at: &str,
    inherited: &Inherited,
    differences: &mut Vec<String>,
) -> Result<Vec<Attestor>, ConvertError> {
    let kinds = [
        entry.keys.is_some(),
        entry.certificates.is_some(),
        entry.keyless.is_some(),
        entry.attestor.is_some(),
    ];
    if kinds.iter().filter(|k| **k).count() != 1 {
        return Err(ConvertError::invalid(
            at,
            "keys, certificates, keyless, or a nested attestor is required (exactly one)",
        ));
    }
    if entry.attestor.is_some() {
        return Err(ConvertError::unsupported(
            format!("{at}.attestor"),
            "nested attestor sets are not converted",
        ));
    }
    let annotations = entry
        .annotations
        .clone()
        .or_else(|| inherited.annotations.clone())
        .unwrap_or_default();
    let repository = entry
        .repository
        .clone()
        .filter(|r| !r.is_empty())
        .or_else(|| inherited.repository.clone().filter(|r| !r.is_empty()));
    let source = repository.map(|repository| Source {
        repository: Some(repository),
        ..Source::default()
    });
    if inherited.notary {
        return notary_entry(entry, at).map(|a| vec![a]);
    }
    let base = Cosign {
        annotations,
        source,
        ..Cosign::default()
    };
    if let Some(keys) = &entry.keys {
        return key_entries(keys, entry, at, base, inherited, differences);
    }
    if let Some(certs) = &entry.certificates {
        return certificate_entry(certs, at, base, differences).map(|a| vec![a]);
    }
    if let Some(keyless) = &entry.keyless {
        return keyless_entry(keyless, at, base, differences).map(|a| vec![a]);
    }
    Err(ConvertError::invalid(at, "no attestor"))
}

/// `certificates`: a signing certificate (and its chain) as a cosign certificate attestor.
fn certificate_entry(
    certs: &model::Certificates,
    at: &str,
    base: Cosign,
    differences: &mut Vec<String>,
) -> Result<Attestor, ConvertError> {
    if certs.cert.as_deref().is_none_or(str::is_empty)
        && certs.cert_chain.as_deref().is_none_or(str::is_empty)
    {
        return Err(ConvertError::invalid(
            format!("{at}.certificates"),
            "cert or certChain required",
        ));
    }
    refuse_variables(certs.cert.as_deref(), &format!("{at}.certificates.cert"))?;
    refuse_variables(
        certs.cert_chain.as_deref(),
        &format!("{at}.certificates.certChain"),
    )?;
    if certs.cert.as_deref().is_none_or(str::is_empty) {
        return Err(ConvertError::unsupported(
            format!("{at}.certificates.cert"),
            "a certChain without cert is not converted (the ImageValidatingPolicy certificate \
             attestor needs the signing certificate)",
        ));
    }
    let value = |s: &Option<String>| {
        s.clone()
            .filter(|s| !s.is_empty())
            .map(|value| StringSource {
                value: Some(value),
                expression: None,
            })
    };
    if certs.cert_chain.as_deref().is_some_and(|c| !c.is_empty())
        && certs.ctlog.as_ref().and_then(|c| c.ignore_sct) == Some(true)
    {
        differences.push(format!(
            "{at}.certificates.ctlog.ignoreSCT: Kyverno v1.19.1 ignores it with a certChain (a \
             bug: the chain is checked before the flag is set) and denies certificates without \
             an embedded SCT; ivory honours it"
        ));
    }
    let cosign = Cosign {
        certificate: Some(CosignCertificate {
            cert: value(&certs.cert),
            cert_chain: value(&certs.cert_chain),
        }),
        ctlog: Some(ctlog(
            certs.rekor.as_ref(),
            certs.ctlog.as_ref(),
            &format!("{at}.certificates"),
        )?),
        ..base
    };
    Ok(cosign_attestor(cosign))
}

/// `keyless`: Fulcio certificates for one identity as a cosign keyless attestor.
fn keyless_entry(
    keyless: &model::Keyless,
    at: &str,
    base: Cosign,
    differences: &mut Vec<String>,
) -> Result<Attestor, ConvertError> {
    if keyless.rekor.is_none() && keyless.roots.as_deref().is_none_or(str::is_empty) {
        return Err(ConvertError::invalid(
            format!("{at}.keyless"),
            "Either Rekor URL or roots are required",
        ));
    }
    for (value, field) in [
        (&keyless.subject, "subject"),
        (&keyless.issuer, "issuer"),
        (&keyless.subject_reg_exp, "subjectRegExp"),
        (&keyless.issuer_reg_exp, "issuerRegExp"),
        (&keyless.roots, "roots"),
    ] {
        refuse_variables(value.as_deref(), &format!("{at}.keyless.{field}"))?;
    }
    let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    identity::check_extensions(keyless, &format!("{at}.keyless"))?;
    let unconstrained = [
        &keyless.subject,
        &keyless.issuer,
        &keyless.subject_reg_exp,
        &keyless.issuer_reg_exp,
    ]
    .into_iter()
    .all(|s| s.as_deref().is_none_or(str::is_empty));
    let identities = if unconstrained {
        differences.push(format!(
            "{at}.keyless: no subject or issuer: Kyverno accepts any identity; the converted \
             attestor says so with subjectRegExp and issuerRegExp '.*'"
        ));
        vec![Identity {
            issuer_reg_exp: Some(".*".to_owned()),
            subject_reg_exp: Some(".*".to_owned()),
            ..Identity::default()
        }]
    } else {
        identity::identities(keyless, &format!("{at}.keyless"))?
    };
    let cosign = Cosign {
        keyless: Some(Keyless {
            additional_extensions: keyless
                .additional_extensions
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, serde_json::Value::String(v)))
                .collect(),
            identities,
            roots: non_empty(&keyless.roots),
        }),
        ctlog: Some(ctlog(
            keyless.rekor.as_ref(),
            keyless.ctlog.as_ref(),
            &format!("{at}.keyless"),
        )?),
        ..base
    };
    Ok(cosign_attestor(cosign))
}

fn key_entries(
    keys: &model::StaticKey,
    entry: &model::Attestor,
    at: &str,
    base: Cosign,
    inherited: &Inherited,
    differences: &mut Vec<String>,
) -> Result<Vec<Attestor>, ConvertError> {
    if keys.secret.is_some() {
        return Err(ConvertError::unsupported(
            format!("{at}.keys.secret"),
            "a key read from a Secret is not converted (put the PEM in publicKeys)",
        ));
    }
    let pem = keys.public_keys.as_deref().unwrap_or_default();
    if pem.is_empty() {
        if keys.kms.as_deref().is_some_and(|k| !k.is_empty()) {
            return Err(ConvertError::unsupported(
                format!("{at}.keys.kms"),
                "KMS keys are not converted: Kyverno asks the cloud's KMS API for the public \
                 key with the webhook's ambient cloud credentials, which come from the instance \
                 metadata address that ivory never connects to (docs/SECURITY.md); a KMS key \
                 version's public key never changes, so export it once (`cosign public-key \
                 --key <the kms URI>`) and give its PEM as publicKeys",
            ));
        }
        return Err(ConvertError::invalid(
            format!("{at}.keys"),
            "A public key, kms key or secret is required",
        ));
    }
    let from_config_map = match inherited.config_maps.data_expression(pem) {
        Some(expression) => Some(
            expression.map_err(|kind| ConvertError::new(format!("{at}.keys.publicKeys"), kind))?,
        ),
        None => {
            refuse_variables(Some(pem), &format!("{at}.keys.publicKeys"))?;
            None
        }
    };
    if pem.trim_start().starts_with("k8s://") {
        return Err(ConvertError::unsupported(
            format!("{at}.keys.publicKeys"),
            "a k8s:// Secret reference is not converted",
        ));
    }
    // The CRD defaults keys.signatureAlgorithm to sha256, and Kyverno's verifier lets that
    // override the attestor's own signatureAlgorithm: the key's value is the one used.
    let hash = keys
        .signature_algorithm
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "sha256".to_owned());
    if !matches!(hash.as_str(), "sha224" | "sha256" | "sha384" | "sha512") {
        return Err(ConvertError::invalid(
            format!("{at}.keys.signatureAlgorithm"),
            format!("Invalid signature algorithm provided: {hash:?}"),
        ));
    }
    if let Some(outer) = entry
        .signature_algorithm
        .as_deref()
        .filter(|s| !s.is_empty())
        && outer != hash
    {
        differences.push(format!(
            "{at}.signatureAlgorithm {outer:?} is ignored, as Kyverno ignores it: the CRD \
             defaults keys.signatureAlgorithm to sha256 and Kyverno uses that ({hash})"
        ));
    }
    let log = ctlog(
        keys.rekor.as_ref(),
        keys.ctlog.as_ref(),
        &format!("{at}.keys"),
    )?;
    if let Some(expression) = from_config_map {
        differences.push(format!(
            "{at}.keys.publicKeys: read from a ConfigMap by resource.Get when the request is \
             judged; a value holding several PEM keys is not split into entries as Kyverno \
             splits it (count counts attestors as written)"
        ));
        return Ok(vec![cosign_attestor(Cosign {
            key: Some(CosignKey {
                expression: Some(expression),
                hash_algorithm: Some(hash),
                ..CosignKey::default()
            }),
            ctlog: Some(log),
            ..base
        })]);
    }
    let split = split_pem(pem);
    if split.len() > 1 && !inherited.expand_keys {
        return Err(ConvertError::unsupported(
            format!("{at}.keys.publicKeys"),
            "several keys in one attestation entry are not converted (Kyverno does not expand \
             them there)",
        ));
    }
    Ok(split
        .into_iter()
        .map(|key| {
            cosign_attestor(Cosign {
                key: Some(CosignKey {
                    data: Some(key),
                    hash_algorithm: Some(hash.clone()),
                    ..CosignKey::default()
                }),
                ctlog: Some(log.clone()),
                ..base.clone()
            })
        })
        .collect())
}

fn notary_entry(entry: &model::Attestor, at: &str) -> Result<Attestor, ConvertError> {
    let Some(certs) = &entry.certificates else {
        return Err(ConvertError::invalid(
            at,
            "type Notary takes certificates only (keys and keyless are not allowed)",
        ));
    };
    let pem = [certs.cert.as_deref(), certs.cert_chain.as_deref()]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    if pem.is_empty() {
        return Err(ConvertError::invalid(
            format!("{at}.certificates"),
            "cert or certChain required",
        ));
    }
    refuse_variables(Some(&pem), &format!("{at}.certificates"))?;
    Ok(Attestor {
        name: String::new(),
        cosign: None,
        notary: Some(Notary {
            certs: Some(StringSource {
                value: Some(pem),
                expression: None,
            }),
            tsa_certs: None,
            trust_policy: None,
        }),
    })
}

fn cosign_attestor(cosign: Cosign) -> Attestor {
    Attestor {
        name: String::new(),
        cosign: Some(cosign),
        notary: None,
    }
}

/// `{{ }}` in `value` (at `at`): Kyverno substitutes it at admission; the conversion cannot.
fn refuse_variables(value: Option<&str>, at: &str) -> Result<(), ConvertError> {
    if value.is_some_and(|v| v.contains("{{")) {
        return Err(ConvertError::variable(
            at,
            "{{ }} variables (ConfigMap lookups, context) are not converted",
        ));
    }
    Ok(())
}

/// Kyverno's `splitPEM`: each key ends at `-----END PUBLIC KEY-----`.
fn split_pem(pem: &str) -> Vec<String> {
    const END: &str = "-----END PUBLIC KEY-----";
    let mut keys = Vec::new();
    let mut rest = pem;
    while let Some(i) = rest.find(END) {
        let (key, tail) = rest.split_at(i + END.len());
        keys.push(format!("{}\n", key.trim()));
        rest = tail;
    }
    if keys.is_empty() {
        keys.push(pem.to_owned());
    }
    keys
}

/// Kyverno's Rekor / CT log options (of the `keys`, `certificates` or `keyless` at `at`) as
/// `cosign.ctlog`.
fn ctlog(rekor: Option<&Rekor>, ct: Option<&CtLog>, at: &str) -> Result<Ctlog, ConvertError> {
    refuse_variables(
        rekor.and_then(|r| r.pubkey.as_deref()),
        &format!("{at}.rekor.pubkey"),
    )?;
    let ignore_tlog = rekor.and_then(|r| r.ignore_tlog).unwrap_or(false);
    let url = match rekor {
        None => Some(PUBLIC_REKOR.to_owned()),
        Some(r) => r.url.clone().filter(|u| !u.is_empty()),
    };
    // An empty url with the log required: Kyverno verifies the signature's embedded log entry
    // offline; ivory always does, against the public log's key unless rekorPubKey names one.
    let url = if url.is_none() && !ignore_tlog {
        Some(PUBLIC_REKOR.to_owned())
    } else {
        url
    };
    Ok(Ctlog {
        ct_log_pub_key: ct.and_then(|c| c.pubkey.clone()).filter(|s| !s.is_empty()),
        insecure_ignore_sct: ct.and_then(|c| c.ignore_sct).filter(|b| *b),
        insecure_ignore_tlog: ignore_tlog.then_some(true),
        rekor_pub_key: rekor
            .and_then(|r| r.pubkey.clone())
            .filter(|s| !s.is_empty()),
        tsa_cert_chain: ct
            .and_then(|c| c.tsa_cert_chain.clone())
            .filter(|s| !s.is_empty()),
        url: if ignore_tlog { None } else { url },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_key_pems_split_like_kyverno() {
        let one = "-----BEGIN PUBLIC KEY-----\nAAA\n-----END PUBLIC KEY-----";
        let two = format!("{one}\n{one}\n");
        assert_eq!(split_pem(one).len(), 1);
        assert_eq!(split_pem(&two).len(), 2);
        assert!(split_pem(&two)[1].starts_with("-----BEGIN"));
    }

    #[test]
    fn rekor_refusals_name_the_attestor_kind_they_are_under() {
        let rekor = Some(model::Rekor {
            url: None,
            pubkey: Some("{{ key }}".to_owned()),
            ignore_tlog: None,
        });
        let keys = model::Attestor {
            keys: Some(model::StaticKey {
                public_keys: Some(
                    "-----BEGIN PUBLIC KEY-----\nAAA\n-----END PUBLIC KEY-----".into(),
                ),
                rekor: rekor.clone(),
                ..model::StaticKey::default()
            }),
            ..model::Attestor::default()
        };
        let keyless = model::Attestor {
            keyless: Some(model::Keyless {
                rekor,
                ..model::Keyless::default()
            }),
            ..model::Attestor::default()
        };
        for (entry, field) in [(keys, "keys"), (keyless, "keyless")] {
            let e = convert_entry(&entry, "e", &Inherited::default(), &mut Vec::new()).unwrap_err();
            assert_eq!(e.path.field(), format!("e.{field}.rekor.pubkey"), "{e}");
        }
    }

    #[test]
    fn rekor_defaults_are_kyvernos() {
        let log = ctlog(None, None, "a").unwrap();
        assert_eq!(log.url.as_deref(), Some(PUBLIC_REKOR));
        assert_eq!(log.insecure_ignore_tlog, None);
        let ignore = Rekor {
            url: Some("https://rekor.example".into()),
            pubkey: None,
            ignore_tlog: Some(true),
        };
        let log = ctlog(Some(&ignore), None, "a").unwrap();
        assert_eq!(log.insecure_ignore_tlog, Some(true));
        assert_eq!(log.url, None);
    }
}

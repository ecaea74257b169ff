//! The revocation check of a Notation signature's certificate chain, from CRLs already held
//! (no IO: a [`RevocationSource`] answers what it holds and is asked, without waiting, to
//! fetch what it lacks). As the Notary Project specifies it: every certificate of the chain
//! but the self-issued root that names a CRL distribution point must be covered by a CRL
//! from one of its `http(s)` points, issued by its issuer (same name, signature verified with
//! the issuer's key, `cRLSign` when the issuer names usages), current (`thisUpdate` passed,
//! `nextUpdate` present and not passed); a listed serial is revoked. A certificate naming no
//! distribution point is not revocable (notation's `nonRevokable`); one naming only an OCSP
//! responder is of unknown status (ivory queries no OCSP responder).
//!
//! Hand-written (the rule in docs/ARCHITECTURE.md) beside rustls-webpki's CRL support, which
//! the chain is already built with: webpki's public API parses a CRL and finds a serial, but
//! checks a CRL's signature, `cRLSign`, expiry and scope only inside path building
//! (`verify_for_usage` with `RevocationOptions`), and there it cannot express Notation's
//! outcomes: (1) it answers one error for the whole path, `CertRevoked` or
//! `UnknownRevocationStatus`, where Notation reports which certificate is revoked and since
//! when, and which distribution point to fetch for the unknown one (the no-IO
//! [`RevocationSource`] is asked for exactly that URL); (2) it does not know where a CRL came
//! from, so a CRL of the same issuer without an issuing distribution point counts for any of
//! its certificates, where Notation takes only a CRL fetched from the certificate's own
//! `http(s)` points (and calls a certificate without any `nonRevokable`, one with only OCSP
//! unknown); (3) it never reads `thisUpdate`, so a CRL issued in the future is used; (4) it
//! keeps no keyUsage of a trust anchor, so a root without `cRLSign` signs CRLs. Oracle:
//! `webpki_oracle::agrees_with_rustls_webpki_where_the_semantics_overlap` runs webpki's own
//! checking on the same certificates and CRLs (good, revoked, expired CRL, wrong signer,
//! issuing distribution point scopes) and both must agree; where they part is
//! `webpki_oracle::where_notation_asks_more_than_rustls_webpki`.

use std::sync::Arc;

use jiff::Timestamp;
use rustls_pki_types::SignatureVerificationAlgorithm;
use sigstore_verify::types::DerCertificate;
use x509_cert::Certificate;
use x509_cert::crl::CertificateList;
use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::der::{Decode as _, Encode as _, EncodeValue as _, Reader as _, SliceReader};
use x509_cert::ext::pkix::name::{DistributionPointName, GeneralName};
use x509_cert::ext::pkix::{
    AuthorityInfoAccessSyntax, CrlDistributionPoints, IssuingDistributionPoint, KeyUsage,
};
use x509_cert::name::Name;
use x509_cert::time::Time;

/// `id-ad-ocsp` (1.3.6.1.5.5.7.48.1).
const ID_AD_OCSP: &str = "1.3.6.1.5.5.7.48.1";
/// `issuingDistributionPoint` (2.5.29.28).
const ID_CE_ISSUING_DISTRIBUTION_POINT: &str = "2.5.29.28";
/// Clock skew allowed on a CRL's `thisUpdate`.
const SKEW_SECONDS: i64 = 300;

/// A CRL as fetched from one distribution point.
#[derive(Debug)]
pub struct FetchedCrl {
    /// The DER bytes, as served.
    pub der: Vec<u8>,
    /// When they were fetched.
    pub fetched_at: Timestamp,
    /// The CRL's `nextUpdate`, when it has one (read at fetch time, for refreshes and metrics).
    pub next_update: Option<Timestamp>,
}

/// Revocation data held in memory: answers at once, never waits.
pub trait RevocationSource: Send + Sync {
    /// The CRL last fetched from `url`, if one was.
    fn crl(&self, url: &str) -> Option<Arc<FetchedCrl>>;
    /// Asks for `url` to be fetched (again) in the background; returns at once.
    fn request(&self, url: &str);
}

/// What the held data says about a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    /// Every revocable certificate is covered by a current CRL that does not list it.
    Good,
    /// A certificate is listed: why, naming it.
    Revoked(String),
    /// A certificate's status cannot be told from the data held: why, naming it.
    Unknown(String),
}

/// The revocation status of `chain` (leaf first, DER) whose last certificate's issuer may be
/// among `anchors`, at `now`. Distribution points without usable data are requested.
pub(crate) fn check_chain(
    chain: &[Vec<u8>],
    anchors: &[DerCertificate],
    source: &dyn RevocationSource,
    algorithms: &[&dyn SignatureVerificationAlgorithm],
    now: Timestamp,
) -> Status {
    let parsed: Result<Vec<Certificate>, _> =
        chain.iter().map(|d| Certificate::from_der(d)).collect();
    let Ok(parsed) = parsed else {
        return Status::Unknown("a certificate of the chain cannot be parsed".into());
    };
    for (i, cert) in parsed.iter().enumerate() {
        let tbs = &cert.tbs_certificate;
        if i + 1 == parsed.len() && tbs.subject == tbs.issuer {
            continue; // the root: trusted as it is
        }
        let urls = match distribution_points(cert) {
            Ok(urls) => urls,
            Err(why) => return Status::Unknown(format!("certificate {}: {why}", tbs.subject)),
        };
        if urls.is_empty() {
            continue; // not revocable
        }
        let Some(issuer) = parsed
            .iter()
            .skip(i + 1)
            .find(|c| c.tbs_certificate.subject == tbs.issuer)
            .cloned()
            .or_else(|| anchor_named(anchors, cert))
        else {
            return Status::Unknown(format!(
                "certificate {}: its issuer is not in the chain",
                tbs.subject
            ));
        };
        match certificate_status(cert, &issuer, &urls, source, algorithms, now) {
            Status::Good => {}
            other => return other,
        }
    }
    Status::Good
}

/// The anchor whose subject is `cert`'s issuer.
fn anchor_named(anchors: &[DerCertificate], cert: &Certificate) -> Option<Certificate> {
    anchors
        .iter()
        .filter_map(|a| Certificate::from_der(a.as_bytes()).ok())
        .find(|a| a.tbs_certificate.subject == cert.tbs_certificate.issuer)
}

/// Why a certificate's revocation status cannot be looked up; the text follows
/// "certificate <subject>: " in the unknown status.
#[derive(Debug, thiserror::Error)]
enum PointsError {
    /// The `cRLDistributionPoints` extension does not decode.
    #[error("its CRL distribution points cannot be read: {0}")]
    Unreadable(x509_cert::der::Error),
    /// Status only by OCSP, which ivory never queries (no request-path IO).
    #[error("it names only an OCSP responder, and ivory queries none")]
    OnlyOcsp,
    /// Points named, none of them ivory can fetch (`ldap:`, `file:`, scoped by reason or issuer).
    #[error("it names CRL distribution points, none of them an http(s) URL")]
    NoHttpPoint,
}

/// The `http(s)` CRL distribution points of `cert` (empty: not revocable). A certificate
/// naming points but none ivory can fetch, or only an OCSP responder, is refused.
fn distribution_points(cert: &Certificate) -> Result<Vec<String>, PointsError> {
    let tbs = &cert.tbs_certificate;
    let points = tbs
        .get::<CrlDistributionPoints>()
        .map_err(PointsError::Unreadable)?;
    let ocsp = tbs
        .get::<AuthorityInfoAccessSyntax>()
        .ok()
        .flatten()
        .is_some_and(|(_, aia)| {
            aia.0
                .iter()
                .any(|d| d.access_method.to_string() == ID_AD_OCSP)
        });
    let Some((_, points)) = points else {
        return if ocsp {
            Err(PointsError::OnlyOcsp)
        } else {
            Ok(Vec::new())
        };
    };
    let urls: Vec<String> = points
        .0
        .iter()
        .filter(|p| p.crl_issuer.is_none() && p.reasons.is_none())
        .filter_map(|p| match &p.distribution_point {
            Some(DistributionPointName::FullName(names)) => Some(names),
            _ => None,
        })
        .flatten()
        .filter_map(|n| match n {
            GeneralName::UniformResourceIdentifier(uri) => Some(uri.to_string()),
            _ => None,
        })
        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
        .take(MAX_POINTS)
        .collect();
    if urls.is_empty() {
        return Err(PointsError::NoHttpPoint);
    }
    Ok(urls)
}

/// Distribution points tried per certificate.
const MAX_POINTS: usize = 4;

/// The first of `urls` whose CRL decides, else unknown (every url without usable data asked for).
fn certificate_status(
    cert: &Certificate,
    issuer: &Certificate,
    urls: &[String],
    source: &dyn RevocationSource,
    algorithms: &[&dyn SignatureVerificationAlgorithm],
    now: Timestamp,
) -> Status {
    let subject = &cert.tbs_certificate.subject;
    let mut why = Vec::new();
    for url in urls {
        let Some(fetched) = source.crl(url) else {
            source.request(url);
            why.push(format!("no CRL fetched yet from {url}"));
            continue;
        };
        match crl_verdict(cert, issuer, &fetched.der, url, algorithms, now) {
            Ok(None) => return Status::Good,
            Ok(Some(revoked_at)) => {
                return Status::Revoked(format!(
                    "certificate {subject} (serial {}) is revoked since {revoked_at} (CRL {url})",
                    cert.tbs_certificate.serial_number
                ));
            }
            Err(problem) => {
                source.request(url);
                why.push(format!("the CRL from {url} {problem}"));
            }
        }
    }
    Status::Unknown(format!(
        "revocation status of certificate {subject} unknown, fetching in background: {}",
        why.join("; ")
    ))
}

/// Why a CRL decides nothing for a certificate (it is fetched again); the text follows "the
/// CRL from <url> " in the unknown status.
#[derive(Debug, thiserror::Error)]
enum CrlError {
    /// Not a DER CRL.
    #[error("cannot be parsed: {0}")]
    Unparsable(x509_cert::der::Error),
    /// Another issuer's CRL: it says nothing of this certificate.
    #[error("is issued by {crl_issuer}, not by the certificate's issuer {cert_issuer}")]
    OtherIssuer {
        /// The CRL's issuer.
        crl_issuer: Name,
        /// The certificate's issuer.
        cert_issuer: Name,
    },
    /// The signed bytes or an algorithm identifier cannot be read back.
    #[error("cannot be verified: malformed")]
    Malformed,
    /// No verifier of the chain's set for the CRL's signature and the issuer's key.
    #[error("cannot be verified: its signature algorithm is not supported")]
    UnsupportedAlgorithm,
    /// Signed by another key than the issuer's: possibly forged.
    #[error("does not verify with the issuer's key (wrong signer)")]
    WrongSigner,
    /// The issuer's key may not sign CRLs.
    #[error("is signed by an issuer whose keyUsage lacks cRLSign")]
    NoCrlSign,
    /// A critical extension ivory does not read could narrow what the CRL covers.
    #[error("has a critical extension ivory does not read ({oid})")]
    UnreadCriticalExtension {
        /// The extension's OID.
        oid: ObjectIdentifier,
    },
    /// The `issuingDistributionPoint` extension does not decode.
    #[error("has an unreadable issuingDistributionPoint: {0}")]
    UnreadableScope(x509_cert::der::Error),
    /// A CRL that lists only some revocations, or another issuer's, or attribute certificates.
    #[error("is an indirect, partitioned or attribute CRL, which ivory does not read")]
    PartialCrl,
    /// Only CA certificates or only end-entity ones, and this certificate is the other kind.
    #[error("does not cover this kind of certificate")]
    OtherKind,
    /// Scoped to a distribution point other than the URL it came from.
    #[error("names another distribution point")]
    OtherPoint,
    /// Issued in the future (beyond the allowed skew).
    #[error("is not valid yet (thisUpdate {this_update})")]
    NotYetValid {
        /// The CRL's `thisUpdate`.
        this_update: Time,
    },
    /// No `nextUpdate`: nothing says how long it is current.
    #[error("has no nextUpdate")]
    NoNextUpdate,
    /// Past its `nextUpdate`: a replayed old CRL could hide a revocation.
    #[error("is stale (nextUpdate {next_update} has passed)")]
    Stale {
        /// The CRL's `nextUpdate`.
        next_update: Time,
    },
}

/// `Ok(None)`: `crl_der` covers `cert` and does not list it; `Ok(Some(when))`: it lists it;
/// `Err`: it cannot be used (says why).
fn crl_verdict(
    cert: &Certificate,
    issuer: &Certificate,
    crl_der: &[u8],
    url: &str,
    algorithms: &[&dyn SignatureVerificationAlgorithm],
    now: Timestamp,
) -> Result<Option<Timestamp>, CrlError> {
    let crl = CertificateList::from_der(crl_der).map_err(CrlError::Unparsable)?;
    let list = &crl.tbs_cert_list;
    if list.issuer != cert.tbs_certificate.issuer {
        return Err(CrlError::OtherIssuer {
            crl_issuer: list.issuer.clone(),
            cert_issuer: cert.tbs_certificate.issuer.clone(),
        });
    }
    verify_crl_signature(crl_der, &crl, issuer, algorithms)?;
    if let Ok(Some((_, usage))) = issuer.tbs_certificate.get::<KeyUsage>()
        && !usage.crl_sign()
    {
        return Err(CrlError::NoCrlSign);
    }
    scope(&crl, cert, url)?;
    let seconds = |t: Time| i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX);
    let this_update = seconds(list.this_update);
    if this_update > now.as_second() + SKEW_SECONDS {
        return Err(CrlError::NotYetValid {
            this_update: list.this_update,
        });
    }
    let next_update = list.next_update.ok_or(CrlError::NoNextUpdate)?;
    if seconds(next_update) <= now.as_second() {
        return Err(CrlError::Stale { next_update });
    }
    let serial = &cert.tbs_certificate.serial_number;
    Ok(list
        .revoked_certificates
        .iter()
        .flatten()
        .find(|r| &r.serial_number == serial)
        .map(|r| Timestamp::from_second(seconds(r.revocation_date)).unwrap_or(now)))
}

/// The CRL's signature verifies with the issuer's key, by the algorithm both name (the
/// chain's algorithm set: rustls-webpki's aws-lc-rs verifiers).
fn verify_crl_signature(
    crl_der: &[u8],
    crl: &CertificateList,
    issuer: &Certificate,
    algorithms: &[&dyn SignatureVerificationAlgorithm],
) -> Result<(), CrlError> {
    let signed = tbs_bytes(crl_der).ok_or(CrlError::Malformed)?;
    let signature_id = algorithm_id_value(&crl.signature_algorithm).ok_or(CrlError::Malformed)?;
    let spki = &issuer.tbs_certificate.subject_public_key_info;
    let key_id = algorithm_id_value(&spki.algorithm).ok_or(CrlError::Malformed)?;
    let algorithm = algorithms
        .iter()
        .find(|a| {
            a.signature_alg_id().as_ref() == signature_id.as_slice()
                && a.public_key_alg_id().as_ref() == key_id.as_slice()
        })
        .ok_or(CrlError::UnsupportedAlgorithm)?;
    algorithm
        .verify_signature(
            spki.subject_public_key.raw_bytes(),
            signed,
            crl.signature.raw_bytes(),
        )
        .map_err(|_| CrlError::WrongSigner)
}

/// The `tbsCertList` bytes exactly as signed.
fn tbs_bytes(crl_der: &[u8]) -> Option<&[u8]> {
    let mut reader = SliceReader::new(crl_der).ok()?;
    let _outer = x509_cert::der::Header::decode(&mut reader).ok()?;
    reader.tlv_bytes().ok()
}

/// An AlgorithmIdentifier's DER contents (without the SEQUENCE header), as webpki names
/// algorithms.
fn algorithm_id_value(id: &x509_cert::spki::AlgorithmIdentifierOwned) -> Option<Vec<u8>> {
    let full = id.to_der().ok()?;
    let value_len = usize::try_from(u32::from(id.value_len().ok()?)).ok()?;
    full.get(full.len().checked_sub(value_len)?..)
        .map(<[u8]>::to_vec)
}

/// The CRL's extensions allow it to cover `cert` fetched from `url`: an issuing distribution
/// point, when present, names `url` and a scope that includes `cert`; no other critical
/// extension (delta CRLs and indirect CRLs are not read).
fn scope(crl: &CertificateList, cert: &Certificate, url: &str) -> Result<(), CrlError> {
    for ext in crl.tbs_cert_list.crl_extensions.iter().flatten() {
        if ext.extn_id.to_string() != ID_CE_ISSUING_DISTRIBUTION_POINT {
            if ext.critical {
                return Err(CrlError::UnreadCriticalExtension { oid: ext.extn_id });
            }
            continue;
        }
        let idp = IssuingDistributionPoint::from_der(ext.extn_value.as_bytes())
            .map_err(CrlError::UnreadableScope)?;
        if idp.indirect_crl || idp.only_some_reasons.is_some() || idp.only_contains_attribute_certs
        {
            return Err(CrlError::PartialCrl);
        }
        let is_ca = cert
            .tbs_certificate
            .get::<x509_cert::ext::pkix::BasicConstraints>()
            .ok()
            .flatten()
            .is_some_and(|(_, bc)| bc.ca);
        if (idp.only_contains_ca_certs && !is_ca) || (idp.only_contains_user_certs && is_ca) {
            return Err(CrlError::OtherKind);
        }
        if let Some(DistributionPointName::FullName(names)) = &idp.distribution_point {
            let named = names.iter().any(
                |n| matches!(n, GeneralName::UniformResourceIdentifier(u) if u.to_string() == url),
            );
            if !named {
                return Err(CrlError::OtherPoint);
            }
        }
    }
    Ok(())
}

/// The `nextUpdate` of a CRL, read when it is fetched (`None`: unreadable or absent).
pub fn next_update_of(crl_der: &[u8]) -> Option<Timestamp> {
    let crl = CertificateList::from_der(crl_der).ok()?;
    let next = crl.tbs_cert_list.next_update?;
    Timestamp::from_second(i64::try_from(next.to_unix_duration().as_secs()).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;

    use super::*;
    use crate::notation::algorithms::CHAIN_ALGORITHMS;

    const URL: &str = "http://127.0.0.1:39517/ivory-revocation.crl";

    fn fixture(path: &str) -> Vec<u8> {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../fixtures/notation-revocation")
                .join(path),
        )
        .unwrap()
    }

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(&fixture(pem))
            .unwrap()
            .as_ref()
            .to_vec()
    }

    /// CRLs by URL, and the URLs asked for.
    #[derive(Default)]
    struct Held {
        crls: BTreeMap<String, Arc<FetchedCrl>>,
        asked: Mutex<Vec<String>>,
    }

    impl RevocationSource for Held {
        fn crl(&self, url: &str) -> Option<Arc<FetchedCrl>> {
            self.crls.get(url).cloned()
        }
        fn request(&self, url: &str) {
            self.asked.lock().unwrap().push(url.to_owned());
        }
    }

    fn holding(crl: &str) -> Held {
        let der = fixture(&format!("crl/{crl}.crl"));
        Held {
            crls: [(
                URL.to_owned(),
                Arc::new(FetchedCrl {
                    next_update: next_update_of(&der),
                    der,
                    fetched_at: Timestamp::now(),
                }),
            )]
            .into(),
            ..Held::default()
        }
    }

    fn status(leaf: &str, held: &Held, now: Timestamp) -> Status {
        let chain = [der(&format!("pki/leaf-{leaf}.pem")), der("pki/root.pem")];
        check_chain(&chain, &[], held, CHAIN_ALGORITHMS, now)
    }

    #[test]
    fn a_chain_is_judged_from_the_crls_held_and_asks_for_what_it_lacks() {
        let now = Timestamp::now();
        // No distribution point: not revocable, nothing asked.
        let none = Held::default();
        assert_eq!(status("plain", &none, now), Status::Good);
        assert!(none.asked.lock().unwrap().is_empty());
        // Nothing held: unknown, naming the URL, and asked for.
        let Status::Unknown(why) = status("rev-good", &none, now) else {
            panic!("unknown expected");
        };
        assert!(
            why.contains("no CRL fetched yet from") && why.contains(URL),
            "{why}"
        );
        assert_eq!(*none.asked.lock().unwrap(), [URL]);
        // The right CRL: good and revoked.
        let good = holding("good");
        assert_eq!(status("rev-good", &good, now), Status::Good);
        let Status::Revoked(why) = status("rev-revoked", &good, now) else {
            panic!("revoked expected");
        };
        assert!(why.contains("rev-revoked signer"), "{why}");
        assert!(good.asked.lock().unwrap().is_empty());
        // Past its nextUpdate, the same CRL decides nothing and is asked for again.
        let later = Timestamp::from_second(now.as_second() + 11 * 365 * 86_400).unwrap();
        let Status::Unknown(why) = status("rev-revoked", &good, later) else {
            panic!("unknown expected");
        };
        assert!(why.contains("is stale"), "{why}");
        assert_eq!(*good.asked.lock().unwrap(), [URL]);
        // Signed by another key, or stale as served: unknown, never "not revoked".
        for (crl, says) in [
            ("wrong-key", "does not verify with the issuer's key"),
            ("stale", "is stale"),
        ] {
            let Status::Unknown(why) = status("rev-revoked", &holding(crl), now) else {
                panic!("{crl}: unknown expected");
            };
            assert!(why.contains(says), "{crl}: {why}");
        }
        // The issuer is found by name, in the chain or among the anchors, never by position.
        let chain = [der("pki/leaf-rev-good.pem"), der("pki/leaf-plain.pem")];
        let Status::Unknown(why) = check_chain(&chain, &[], &good, CHAIN_ALGORITHMS, now) else {
            panic!("unknown expected");
        };
        assert!(why.contains("its issuer is not in the chain"), "{why}");
        let root = sigstore_verify::types::DerCertificate::new(der("pki/root.pem"));
        let chain = [der("pki/leaf-rev-good.pem")];
        assert_eq!(
            check_chain(&chain, &[root], &good, CHAIN_ALGORITHMS, now),
            Status::Good
        );
    }

    #[test]
    fn why_a_crl_decides_nothing_reads_as_a_sentence_about_it() {
        let now = Timestamp::now();
        let leaf = Certificate::from_der(&der("pki/leaf-rev-revoked.pem")).unwrap();
        let root = Certificate::from_der(&der("pki/root.pem")).unwrap();
        let verdict = |crl: &str| {
            crl_verdict(
                &leaf,
                &root,
                &fixture(&format!("crl/{crl}.crl")),
                URL,
                CHAIN_ALGORITHMS,
                now,
            )
        };
        assert!(matches!(verdict("good"), Ok(Some(_))));
        assert!(matches!(verdict("wrong-key"), Err(CrlError::WrongSigner)));
        let Err(stale @ CrlError::Stale { .. }) = verdict("stale") else {
            panic!("stale expected");
        };
        let text = stale.to_string();
        assert!(
            text.starts_with("is stale (nextUpdate ") && text.ends_with(" has passed)"),
            "{text}"
        );
        let Err(CrlError::Unparsable(_)) =
            crl_verdict(&leaf, &root, b"not a CRL", URL, CHAIN_ALGORITHMS, now)
        else {
            panic!("unparsable expected");
        };
        assert_eq!(
            CrlError::WrongSigner.to_string(),
            "does not verify with the issuer's key (wrong signer)"
        );
        assert_eq!(
            CrlError::Malformed.to_string(),
            "cannot be verified: malformed"
        );
        assert_eq!(
            PointsError::OnlyOcsp.to_string(),
            "it names only an OCSP responder, and ivory queries none"
        );
    }
}

#[cfg(test)]
mod webpki_oracle;

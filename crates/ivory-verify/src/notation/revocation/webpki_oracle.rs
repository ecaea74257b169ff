//! The oracle of the hand-written CRL check: rustls-webpki's own revocation checking (path
//! building with `RevocationOptions`: chain depth, unknown status denied, expiry enforced) on
//! the same certificates and CRLs, made here with rcgen. Both must agree wherever their
//! semantics overlap: good, revoked, expired CRL, wrong signer, an issuing distribution point
//! that names the certificate's point, another point, or the other kind of certificate.
//! Where they part is asserted too, with why (the module docs of `revocation`).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer,
    CrlDistributionPoint, CrlIssuingDistributionPoint, CrlScope, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevokedCertParams, SerialNumber, date_time_ymd,
};
use rustls_pki_types::{CertificateDer, UnixTime};
use webpki::{
    CertRevocationList, EndEntityCert, ExpirationPolicy, KeyUsage, OwnedCertRevocationList,
    RevocationCheckDepth, RevocationOptionsBuilder, UnknownStatusPolicy,
};

use super::{FetchedCrl, RevocationSource, Status, check_chain};
use crate::notation::algorithms::CHAIN_ALGORITHMS;

const URL: &str = "http://crl.ivory.test/ca.crl";
const OTHER_URL: &str = "http://crl.ivory.test/other.crl";
/// `id-kp-codeSigning`, the usage Notation asks of a signing certificate.
const ID_KP_CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];
const LEAF_SERIAL: u64 = 0x1234;

/// A root that may sign CRLs, one whose usages leave `cRLSign` out, and a leaf of each
/// naming [`URL`].
struct Pki {
    root: CertifiedIssuer<'static, KeyPair>,
    leaf: Vec<u8>,
    /// The same name as the root, another key.
    impostor: Issuer<'static, KeyPair>,
    no_crl_sign_root: Vec<u8>,
    no_crl_sign: Issuer<'static, KeyPair>,
    no_crl_sign_leaf: Vec<u8>,
}

fn root_params(key_usages: Vec<KeyUsagePurpose>) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "oracle root");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = key_usages;
    params.not_before = date_time_ymd(2020, 1, 1);
    params.not_after = date_time_ymd(2040, 1, 1);
    params.key_identifier_method = KeyIdMethod::Sha256;
    params
}

fn leaf_of(issuer: &Issuer<'_, KeyPair>) -> Vec<u8> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "oracle leaf");
    params.serial_number = Some(SerialNumber::from(LEAF_SERIAL));
    params.crl_distribution_points = vec![CrlDistributionPoint {
        uris: vec![URL.to_owned()],
    }];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
    params.not_before = date_time_ymd(2020, 1, 1);
    params.not_after = date_time_ymd(2039, 1, 1);
    let key = KeyPair::generate().unwrap();
    params.signed_by(&key, issuer).unwrap().der().to_vec()
}

fn pki() -> Pki {
    let usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let root =
        CertifiedIssuer::self_signed(root_params(usages.clone()), KeyPair::generate().unwrap())
            .unwrap();
    let leaf = leaf_of(&root);
    let impostor = Issuer::new(root_params(usages), KeyPair::generate().unwrap());
    // rcgen refuses to sign a CRL for an issuer whose usages lack cRLSign, so the signing
    // issuer names none (any usage) while its certificate names only keyCertSign.
    let key = KeyPair::generate().unwrap();
    let no_crl_sign_root = root_params(vec![KeyUsagePurpose::KeyCertSign])
        .self_signed(&key)
        .unwrap()
        .der()
        .to_vec();
    let no_crl_sign = Issuer::new(root_params(Vec::new()), key);
    let no_crl_sign_leaf = leaf_of(&no_crl_sign);
    Pki {
        root,
        leaf,
        impostor,
        no_crl_sign_root,
        no_crl_sign,
        no_crl_sign_leaf,
    }
}

/// How one CRL is made.
#[derive(Clone, Copy)]
struct Crl {
    revoked: bool,
    this_update: (i32, u8),
    next_update: (i32, u8),
    scope: Option<(&'static str, Option<CrlScope>)>,
}

const CURRENT: Crl = Crl {
    revoked: false,
    this_update: (2026, 1),
    next_update: (2027, 1),
    scope: None,
};

fn make(crl: Crl, by: &Issuer<'_, KeyPair>) -> Vec<u8> {
    let params = CertificateRevocationListParams {
        this_update: date_time_ymd(crl.this_update.0, crl.this_update.1, 1),
        next_update: date_time_ymd(crl.next_update.0, crl.next_update.1, 1),
        crl_number: SerialNumber::from(1u64),
        issuing_distribution_point: crl.scope.map(|(url, scope)| CrlIssuingDistributionPoint {
            distribution_point: CrlDistributionPoint {
                uris: vec![url.to_owned()],
            },
            scope,
        }),
        revoked_certs: crl
            .revoked
            .then(|| RevokedCertParams {
                serial_number: SerialNumber::from(LEAF_SERIAL),
                revocation_time: date_time_ymd(2025, 6, 1),
                reason_code: None,
                invalidity_date: None,
            })
            .into_iter()
            .collect(),
        key_identifier_method: KeyIdMethod::Sha256,
    };
    params.signed_by(by).unwrap().der().to_vec()
}

/// What both can say: the certificate is good, revoked, or the CRL decides nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Good,
    Revoked,
    Undecided,
}

/// The CRL held for [`URL`].
struct Held(Vec<u8>);

impl RevocationSource for Held {
    fn crl(&self, _url: &str) -> Option<Arc<FetchedCrl>> {
        Some(Arc::new(FetchedCrl {
            der: self.0.clone(),
            fetched_at: Timestamp::UNIX_EPOCH,
            next_update: None,
        }))
    }
    fn request(&self, _url: &str) {}
}

fn ours(chain: [&[u8]; 2], crl: &[u8], now: Timestamp) -> (Outcome, String) {
    let chain = chain.map(<[u8]>::to_vec);
    match check_chain(&chain, &[], &Held(crl.to_vec()), CHAIN_ALGORITHMS, now) {
        Status::Good => (Outcome::Good, String::new()),
        Status::Revoked(why) => (Outcome::Revoked, why),
        Status::Unknown(why) => (Outcome::Undecided, why),
    }
}

fn webpki(chain: [&[u8]; 2], crl: &[u8], now: Timestamp) -> (Outcome, String) {
    let crl = match OwnedCertRevocationList::from_der(crl) {
        Ok(crl) => CertRevocationList::from(crl),
        Err(e) => return (Outcome::Undecided, format!("{e:?}")),
    };
    let crls = [&crl];
    let options = RevocationOptionsBuilder::new(&crls)
        .unwrap()
        .with_depth(RevocationCheckDepth::Chain)
        .with_status_policy(UnknownStatusPolicy::Deny)
        .with_expiration_policy(ExpirationPolicy::Enforce)
        .build();
    let root = CertificateDer::from(chain[1]);
    let anchors = [webpki::anchor_from_trusted_cert(&root).unwrap()];
    let leaf = CertificateDer::from(chain[0]);
    let ee = EndEntityCert::try_from(&leaf).unwrap();
    let seconds = u64::try_from(now.as_second()).unwrap();
    let result = ee.verify_for_usage(
        CHAIN_ALGORITHMS,
        &anchors,
        &[],
        UnixTime::since_unix_epoch(Duration::from_secs(seconds)),
        KeyUsage::required_if_present(ID_KP_CODE_SIGNING),
        Some(options),
        None,
    );
    match result {
        Ok(_) => (Outcome::Good, String::new()),
        Err(webpki::Error::CertRevoked) => (Outcome::Revoked, "CertRevoked".into()),
        Err(e) => (Outcome::Undecided, format!("{e:?}")),
    }
}

fn now() -> Timestamp {
    "2026-06-01T00:00:00Z".parse().unwrap()
}

#[test]
fn agrees_with_rustls_webpki_where_the_semantics_overlap() {
    let pki = pki();
    let root = pki.root.der().to_vec();
    let chain = [pki.leaf.as_slice(), root.as_slice()];
    let revoked = Crl {
        revoked: true,
        ..CURRENT
    };
    let cases: Vec<(&str, Vec<u8>, Outcome)> = vec![
        ("good", make(CURRENT, &pki.root), Outcome::Good),
        ("revoked", make(revoked, &pki.root), Outcome::Revoked),
        (
            "expired CRL",
            make(
                Crl {
                    next_update: (2026, 3),
                    ..revoked
                },
                &pki.root,
            ),
            Outcome::Undecided,
        ),
        (
            "wrong signer",
            make(revoked, &pki.impostor),
            Outcome::Undecided,
        ),
        (
            "scoped to its own point",
            make(
                Crl {
                    scope: Some((URL, None)),
                    ..revoked
                },
                &pki.root,
            ),
            Outcome::Revoked,
        ),
        (
            "scoped to another point",
            make(
                Crl {
                    scope: Some((OTHER_URL, None)),
                    ..revoked
                },
                &pki.root,
            ),
            Outcome::Undecided,
        ),
        (
            "user certificates only",
            make(
                Crl {
                    scope: Some((URL, Some(CrlScope::UserCertsOnly))),
                    ..revoked
                },
                &pki.root,
            ),
            Outcome::Revoked,
        ),
        (
            "CA certificates only",
            make(
                Crl {
                    scope: Some((URL, Some(CrlScope::CaCertsOnly))),
                    ..revoked
                },
                &pki.root,
            ),
            Outcome::Undecided,
        ),
    ];
    for (case, crl, expected) in cases {
        let (theirs, their_why) = webpki(chain, &crl, now());
        let (ours, our_why) = ours(chain, &crl, now());
        assert_eq!(theirs, expected, "{case}: webpki said {their_why}");
        assert_eq!(ours, expected, "{case}: ivory said {our_why}");
    }
}

/// Where Notation asks more than webpki can be told: a CRL issued in the future (beyond the
/// skew) is refused by ivory and read by webpki, which never looks at `thisUpdate`; a trust
/// anchor whose keyUsage lacks `cRLSign` may sign CRLs for webpki, not for Notation; and a
/// revocation names the certificate, its serial and since when, where webpki says only
/// `CertRevoked` for the whole path.
#[test]
fn where_notation_asks_more_than_rustls_webpki() {
    let pki = pki();
    let root = pki.root.der().to_vec();
    let chain = [pki.leaf.as_slice(), root.as_slice()];
    let future = make(
        Crl {
            revoked: true,
            this_update: (2026, 9),
            ..CURRENT
        },
        &pki.root,
    );
    assert_eq!(webpki(chain, &future, now()).0, Outcome::Revoked);
    let (outcome, why) = ours(chain, &future, now());
    assert_eq!(outcome, Outcome::Undecided);
    assert!(why.contains("is not valid yet"), "{why}");

    // webpki keeps of a trust anchor only its name and key, so a root whose keyUsage leaves
    // cRLSign out still signs CRLs for it; Notation (Go's CheckSignatureFrom) and ivory refuse.
    let chain_no_crl_sign = [pki.no_crl_sign_leaf.as_slice(), &pki.no_crl_sign_root];
    let by_no_crl_sign = make(
        Crl {
            revoked: true,
            ..CURRENT
        },
        &pki.no_crl_sign,
    );
    assert_eq!(
        webpki(chain_no_crl_sign, &by_no_crl_sign, now()).0,
        Outcome::Revoked
    );
    let (outcome, why) = ours(chain_no_crl_sign, &by_no_crl_sign, now());
    assert_eq!(outcome, Outcome::Undecided);
    assert!(why.contains("lacks cRLSign"), "{why}");

    let revoked = make(
        Crl {
            revoked: true,
            ..CURRENT
        },
        &pki.root,
    );
    assert_eq!(webpki(chain, &revoked, now()).1, "CertRevoked");
    let (_, why) = ours(chain, &revoked, now());
    assert!(
        why.contains("oracle leaf") && why.contains("12:34") && why.contains("2025-06-01"),
        "{why}"
    );
}

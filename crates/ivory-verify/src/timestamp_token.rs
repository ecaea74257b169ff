//! RFC 3161 timestamp tokens as timestamp authorities make them. OpenSSL's TSA (`openssl ts
//! -reply`, with the usual `certs` chain file that holds the signer's certificate too) puts the
//! signer's certificate twice in SignedData's `certificates`. Go's `encoding/asn1` reads such a
//! SET OF as it is (notation-go, sigstore-go); the `der` crate under `cms` and sigstore-tsa
//! refuses it ("SET OF contains duplicate"). So every token is read with its certificate set
//! deduplicated first: `certificates` is outside what the TSA signed (the signature covers the
//! signed attributes, which hold the TSTInfo's digest), so the signature, the TSTInfo and every
//! check are unchanged; the certificates stay candidates only, trusted once a chain from them to
//! the configured TSA roots verifies. Nothing else is relaxed: any other DER error stays one.

use std::collections::BTreeSet;

use x509_cert::der::asn1::{Any, AnyRef, ObjectIdentifier};
use x509_cert::der::{Decode as _, Encode as _, Reader as _, SliceReader, Tag, TagNumber, Tagged};

/// `id-signedData`, the content type of a TimeStampToken.
const ID_SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");

/// `[0]` constructed: ContentInfo's explicit `content`, SignedData's implicit `certificates`
/// (the only `[0]` field of SignedData).
const CONTEXT_0: Tag = Tag::ContextSpecific {
    constructed: true,
    number: TagNumber::N0,
};

/// `token` (a TimeStampToken, or a TimeStampResp carrying one, as Sigstore bundles hold) with
/// each certificate of its SignedData once; `None` when no certificate is repeated, or when
/// `token` is not shaped as a token at all (the readers then refuse it as they would).
pub(crate) fn without_repeated_certificates(token: &[u8]) -> Option<Vec<u8>> {
    let outer = AnyRef::from_der(token).ok()?;
    if outer.tag() != Tag::Sequence {
        return None;
    }
    let fields = fields(outer.value())?;
    match fields.first()?.tag() {
        Tag::ObjectIdentifier => content_info(&fields),
        // TimeStampResp: the status, then the token.
        Tag::Sequence => {
            let token = fields.get(1).filter(|t| t.tag() == Tag::Sequence)?;
            let rewritten = content_info(&self::fields(token.value())?)?;
            let mut parts = Vec::with_capacity(fields.len());
            for (n, field) in fields.iter().enumerate() {
                parts.push(match n {
                    1 => rewritten.clone(),
                    _ => field.to_der().ok()?,
                });
            }
            encoded(Tag::Sequence, parts.concat())
        }
        _ => None,
    }
}

/// The TLVs `value` is made of.
fn fields(value: &[u8]) -> Option<Vec<AnyRef<'_>>> {
    let mut reader = SliceReader::new(value).ok()?;
    let mut fields = Vec::new();
    while !reader.is_finished() {
        fields.push(reader.decode::<AnyRef<'_>>().ok()?);
    }
    Some(fields)
}

/// A ContentInfo (its `fields`) holding SignedData, re-encoded with its certificate set
/// deduplicated; `None` when nothing is repeated.
fn content_info(fields: &[AnyRef<'_>]) -> Option<Vec<u8>> {
    let [content_type, content] = fields else {
        return None;
    };
    if content_type.decode_as::<ObjectIdentifier>().ok()? != ID_SIGNED_DATA
        || content.tag() != CONTEXT_0
    {
        return None;
    }
    let signed_data = AnyRef::from_der(content.value()).ok()?;
    if signed_data.tag() != Tag::Sequence {
        return None;
    }
    let signed_fields = self::fields(signed_data.value())?;
    let at = signed_fields.iter().position(|f| f.tag() == CONTEXT_0)?;
    let certificates = self::fields(signed_fields.get(at)?.value())?;
    let distinct: BTreeSet<Vec<u8>> = certificates
        .iter()
        .map(|c| c.to_der().ok())
        .collect::<Option<_>>()?;
    if distinct.len() == certificates.len() {
        return None;
    }
    // DER orders a SET OF by its elements' encodings: a BTreeSet of them is in that order.
    let certificates = encoded(CONTEXT_0, distinct.into_iter().flatten().collect())?;
    let mut parts = Vec::with_capacity(signed_fields.len());
    for (n, field) in signed_fields.iter().enumerate() {
        parts.push(match n == at {
            true => certificates.clone(),
            false => field.to_der().ok()?,
        });
    }
    let signed_data = encoded(Tag::Sequence, parts.concat())?;
    let content = encoded(CONTEXT_0, signed_data)?;
    encoded(
        Tag::Sequence,
        [content_type.to_der().ok()?, content].concat(),
    )
}

/// The DER TLV of `tag` around `value`.
fn encoded(tag: Tag, value: Vec<u8>) -> Option<Vec<u8>> {
    Any::new(tag, value).ok()?.to_der().ok()
}

#[cfg(test)]
mod tests {
    use cms::cert::CertificateChoices;
    use cms::content_info::ContentInfo;
    use cms::signed_data::SignedData;
    use ivory_testkit::{OpensslTsa, TsaKey};

    use super::*;

    /// The certificates of a TimeStampToken, as `cms` reads them (strict DER).
    fn certificates(token: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        let info = ContentInfo::from_der(token).map_err(|e| e.to_string())?;
        let signed: SignedData = info.content.decode_as().map_err(|e| e.to_string())?;
        Ok(signed
            .certificates
            .map(|set| {
                set.0
                    .iter()
                    .filter_map(|c| match c {
                        CertificateChoices::Certificate(c) => c.to_der().ok(),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// OpenSSL's TSA, RSA and ECDSA: its token repeats the TSA certificate, which `cms` refuses;
    /// with the repeat removed `cms` reads it, and OpenSSL itself still verifies it (the oracle:
    /// nothing the TSA signed moved). The same for the TimeStampResp a Sigstore bundle holds.
    #[test]
    fn openssl_tokens_are_read_once_their_repeated_certificate_is_removed() {
        for key in [TsaKey::Rsa, TsaKey::EcP256] {
            let tsa = OpensslTsa::new(key).unwrap();
            let data = format!("signature bytes {key:?}");
            let token = tsa.token(data.as_bytes()).unwrap();
            let refused = certificates(&token).unwrap_err();
            assert!(refused.contains("duplicate"), "{key:?}: {refused}");
            assert!(tsa.verifies(&token, data.as_bytes()).unwrap());

            let rewritten = without_repeated_certificates(&token).unwrap();
            let read = certificates(&rewritten).unwrap();
            assert_eq!(read.len(), 2, "{key:?}: the TSA certificate and its root");
            assert!(
                tsa.verifies(&rewritten, data.as_bytes()).unwrap(),
                "{key:?}: OpenSSL verifies the rewritten token"
            );
            assert!(
                !tsa.verifies(&rewritten, b"other bytes").unwrap(),
                "{key:?}: the oracle can say no"
            );
            assert_eq!(without_repeated_certificates(&rewritten), None);

            let response = tsa.response(data.as_bytes()).unwrap();
            let rewritten = without_repeated_certificates(&response).unwrap();
            let outer = AnyRef::from_der(&rewritten).unwrap();
            let parts = fields(outer.value()).unwrap();
            assert_eq!(parts.len(), 2, "status and token");
            assert_eq!(certificates(&parts[1].to_der().unwrap()).unwrap().len(), 2);
        }
    }

    /// Every truncation and every single-byte change of a real token (the bytes a registry or a
    /// signer controls): no panic, and a rewrite only ever drops repeated certificates (it is
    /// shorter than what it was made from, and repeats nothing).
    #[test]
    fn damaged_tokens_are_rewritten_only_by_dropping_repeats() {
        let tsa = OpensslTsa::new(TsaKey::EcP256).unwrap();
        let token = tsa.token(b"signature").unwrap();
        let check = |bytes: &[u8]| {
            if let Some(rewritten) = without_repeated_certificates(bytes) {
                assert!(rewritten.len() < bytes.len());
                assert_eq!(without_repeated_certificates(&rewritten), None);
            }
        };
        for end in 0..token.len() {
            check(&token[..end]);
        }
        for at in 0..token.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut damaged = token.clone();
                damaged[at] ^= flip;
                check(&damaged);
            }
        }
    }

    /// A token that repeats nothing is left as it is, and what is not a token is not touched.
    #[test]
    fn tokens_without_repeats_and_other_bytes_are_left_alone() {
        let bundle: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!(
                "{}/../../fixtures/keyless/keyless-js-tsa.bundle.json",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap(),
        )
        .unwrap();
        let sigstore_tsa = bundle["verificationMaterial"]["timestampVerificationData"]
            ["rfc3161Timestamps"][0]["signedTimestamp"]
            .as_str()
            .unwrap();
        use base64::Engine as _;
        let sigstore_tsa = base64::engine::general_purpose::STANDARD
            .decode(sigstore_tsa)
            .unwrap();
        assert_eq!(without_repeated_certificates(&sigstore_tsa), None);
        for bytes in [&b""[..], b"\x30\x00", b"\x30\x03\x06\x01\x00", b"not DER"] {
            assert_eq!(without_repeated_certificates(bytes), None);
        }
    }
}

//! What an RFC 3161 timestamp token's `genTime` looks like, read from its DER structure: the
//! decision to retry a Sigstore verification without a timestamp is made from the token, never
//! from the text of the error sigstore-tsa gave.

use cms::content_info::ContentInfo;
use cms::signed_data::SignedData;
use x509_cert::der::asn1::Any;
use x509_cert::der::{Decode as _, Reader as _, SliceReader, Tag, Tagged as _};

/// Fields of `TSTInfo` before `genTime` (RFC 3161 §2.4.2): version, policy, messageImprint,
/// serialNumber.
const FIELDS_BEFORE_GEN_TIME: usize = 4;

/// Whether `token` (a DER `TimeStampToken`, or a `TimeStampResp` carrying one, as Sigstore
/// bundles do) is a well-formed token
/// whose `genTime` has fractional seconds (`20261202111849.866Z`). RFC 3161 allows them;
/// sigstore-tsa 0.15.1 cannot decode them. `false` for anything else, a malformed token
/// included: that one gets no second chance.
pub(super) fn has_fractional_gen_time(token: &[u8]) -> bool {
    gen_time(token).is_some_and(|time| time.contains(&b'.'))
}

/// The content octets of the token's `genTime`.
fn gen_time(token: &[u8]) -> Option<Vec<u8>> {
    let info = token_content(token)?;
    let signed = info.content.decode_as::<SignedData>().ok()?;
    // The eContent is an OCTET STRING whose contents are the DER TSTInfo.
    let tst_info = signed.encap_content_info.econtent?;
    let sequence = Any::from_der(tst_info.value()).ok()?;
    if sequence.tag() != Tag::Sequence {
        return None;
    }
    let mut fields = SliceReader::new(sequence.value()).ok()?;
    for _ in 0..FIELDS_BEFORE_GEN_TIME {
        fields.decode::<Any>().ok()?;
    }
    let gen_time = fields.decode::<Any>().ok()?;
    (gen_time.tag() == Tag::GeneralizedTime).then(|| gen_time.value().to_vec())
}

/// The `TimeStampToken` itself, or the one a `TimeStampResp` (status, then token) carries.
fn token_content(token: &[u8]) -> Option<ContentInfo> {
    if let Ok(info) = ContentInfo::from_der(token) {
        return Some(info);
    }
    let response = Any::from_der(token).ok()?;
    if response.tag() != Tag::Sequence {
        return None;
    }
    let mut fields = SliceReader::new(response.value()).ok()?;
    fields.decode::<Any>().ok()?;
    fields.decode::<ContentInfo>().ok()
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    fn fixture_token() -> Vec<u8> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/keyless/keyless-js-tsa.bundle.json"
        );
        let bundle: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let encoded = bundle["verificationMaterial"]["timestampVerificationData"]
            ["rfc3161Timestamps"][0]["signedTimestamp"]
            .as_str()
            .unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap()
    }

    #[test]
    fn a_fractional_gen_time_is_read_from_the_tokens_structure() {
        let token = fixture_token();
        assert_eq!(
            gen_time(&token).as_deref(),
            Some(&b"20261202111849.866Z"[..])
        );
        assert!(has_fractional_gen_time(&token));
    }

    #[test]
    fn whole_seconds_and_malformed_tokens_get_no_second_chance() {
        let token = fixture_token();
        // The same token without the fraction's point, same length (`…49.866Z` → `…49Z` would
        // change every enclosing length).
        let at = token
            .windows(4)
            .position(|w| w == b".866")
            .expect("fraction in the fixture token");
        let mut whole = token.clone();
        whole[at..at + 4].copy_from_slice(b"0000");
        assert_eq!(
            gen_time(&whole).as_deref(),
            Some(&b"202612021118490000Z"[..])
        );
        assert!(!has_fractional_gen_time(&whole));
        assert!(!has_fractional_gen_time(b"not der"));
        assert!(!has_fractional_gen_time(&token[..token.len() / 2]));
        // A message text saying "decode" decides nothing: only the token's structure does.
        assert!(!has_fractional_gen_time(b"failed to decode TSTInfo"));
    }
}

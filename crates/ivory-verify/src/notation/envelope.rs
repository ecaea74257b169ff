//! Notary Project signature envelopes (JWS JSON serialization, `application/jose+json`, and
//! COSE_Sign1, `application/cose`) read into one [`SignedEnvelope`]: what was signed, the bytes
//! the signature covers, the signing certificate chain and the signed attributes the Notary
//! Project signature specification defines. Parsing only: nothing here decides trust.
//!
//! Refused while parsing (integrity, whatever the trust policy): an algorithm outside the
//! specification's list, a content type other than the Notary payload's, a critical header
//! ivory does not know, a header the specification makes critical that is not marked so, a
//! missing signing scheme or signing time, an unprotected header other than the certificate
//! chain, the signing agent and the timestamp countersignature, more than
//! [`MAX_CHAIN`] certificates.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use coset::cbor::value::Value as Cbor;
use coset::{CoseSign1, Label, RegisteredLabelWithPrivate, TaggedCborSerializable as _, iana};
use ivory_registry::{JsonLimits, parse_json_bounded};
use jiff::Timestamp;
use serde::Deserialize;
use serde_json::Value;

/// Media type of a JWS envelope layer.
pub const JWS_MEDIA_TYPE: &str = "application/jose+json";
/// Media type of a COSE envelope layer.
pub const COSE_MEDIA_TYPE: &str = "application/cose";
/// The only payload content type the specification defines.
pub const PAYLOAD_CONTENT_TYPE: &str = "application/vnd.cncf.notary.payload.v1+json";
/// Most certificates read from one envelope's chain (notation's own bound is 10 intermediates).
pub const MAX_CHAIN: usize = 11;

const SIGNING_SCHEME: &str = "io.cncf.notary.signingScheme";
const SIGNING_TIME: &str = "io.cncf.notary.signingTime";
const AUTHENTIC_SIGNING_TIME: &str = "io.cncf.notary.authenticSigningTime";
const EXPIRY: &str = "io.cncf.notary.expiry";
const SIGNING_AGENT: &str = "io.cncf.notary.signingAgent";
const TIMESTAMP_SIGNATURE: &str = "io.cncf.notary.timestampSignature";
/// COSE `x5chain` (RFC 9360).
const X5CHAIN: i64 = 33;

/// The signature algorithms the Notary Project allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// RSASSA-PSS with SHA-256 (RSA 2048).
    Ps256,
    /// RSASSA-PSS with SHA-384 (RSA 3072).
    Ps384,
    /// RSASSA-PSS with SHA-512 (RSA 4096).
    Ps512,
    /// ECDSA P-256 with SHA-256.
    Es256,
    /// ECDSA P-384 with SHA-384.
    Es384,
    /// ECDSA P-521 with SHA-512.
    Es512,
}

impl Algorithm {
    fn from_jws(name: &str) -> Option<Self> {
        Some(match name {
            "PS256" => Self::Ps256,
            "PS384" => Self::Ps384,
            "PS512" => Self::Ps512,
            "ES256" => Self::Es256,
            "ES384" => Self::Es384,
            "ES512" => Self::Es512,
            _ => return None,
        })
    }

    fn from_cose(alg: &coset::Algorithm) -> Option<Self> {
        Some(match alg {
            RegisteredLabelWithPrivate::Assigned(iana::Algorithm::PS256) => Self::Ps256,
            RegisteredLabelWithPrivate::Assigned(iana::Algorithm::PS384) => Self::Ps384,
            RegisteredLabelWithPrivate::Assigned(iana::Algorithm::PS512) => Self::Ps512,
            RegisteredLabelWithPrivate::Assigned(iana::Algorithm::ES256) => Self::Es256,
            RegisteredLabelWithPrivate::Assigned(iana::Algorithm::ES384) => Self::Es384,
            RegisteredLabelWithPrivate::Assigned(iana::Algorithm::ES512) => Self::Es512,
            _ => return None,
        })
    }

    /// The JWS name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ps256 => "PS256",
            Self::Ps384 => "PS384",
            Self::Ps512 => "PS512",
            Self::Es256 => "ES256",
            Self::Es384 => "ES384",
            Self::Es512 => "ES512",
        }
    }
}

/// `io.cncf.notary.signingScheme`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigningScheme {
    /// `notary.x509`: the signing time is the signer's claim; a timestamp makes it authentic.
    X509,
    /// `notary.x509.signingAuthority`: the signing authority vouches for the signing time.
    SigningAuthority,
}

/// Which envelope format a signature came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JWS JSON serialization.
    Jws,
    /// COSE_Sign1.
    Cose,
}

/// A parsed envelope. Nothing in it is verified yet.
#[derive(Clone, Debug)]
pub struct SignedEnvelope {
    /// JWS or COSE.
    pub format: Format,
    /// The signature algorithm the protected header names.
    pub algorithm: Algorithm,
    /// The bytes the signature covers (JWS signing input, COSE `Sig_structure`).
    pub signed_bytes: Vec<u8>,
    /// The signature value (ECDSA as fixed-width `r || s`).
    pub signature: Vec<u8>,
    /// The Notary payload, as signed.
    pub payload: Vec<u8>,
    /// DER certificates, signing certificate first.
    pub chain: Vec<Vec<u8>>,
    /// The signing scheme.
    pub scheme: SigningScheme,
    /// `io.cncf.notary.signingTime` (`notary.x509`).
    pub signing_time: Option<Timestamp>,
    /// `io.cncf.notary.authenticSigningTime` (`notary.x509.signingAuthority`).
    pub authentic_signing_time: Option<Timestamp>,
    /// `io.cncf.notary.expiry`.
    pub expiry: Option<Timestamp>,
    /// The RFC 3161 timestamp token countersigning the signature, if any.
    pub timestamp_token: Option<Vec<u8>>,
}

/// Why an envelope cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{format} envelope: {detail}")]
pub struct EnvelopeError {
    format: &'static str,
    detail: String,
}

fn jws_error(detail: impl Into<String>) -> EnvelopeError {
    EnvelopeError {
        format: "JWS",
        detail: detail.into(),
    }
}

fn cose_error(detail: impl Into<String>) -> EnvelopeError {
    EnvelopeError {
        format: "COSE",
        detail: detail.into(),
    }
}

/// Reads an envelope layer of `media_type`.
pub fn parse(media_type: &str, bytes: &[u8]) -> Result<SignedEnvelope, EnvelopeError> {
    match media_type {
        JWS_MEDIA_TYPE => parse_jws(bytes),
        COSE_MEDIA_TYPE => parse_cose(bytes),
        other => Err(EnvelopeError {
            format: "signature",
            detail: format!(
                "media type {other:?} is neither {JWS_MEDIA_TYPE} nor {COSE_MEDIA_TYPE}"
            ),
        }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JwsJson {
    payload: String,
    protected: String,
    #[serde(default)]
    header: JwsUnprotected,
    signature: String,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct JwsUnprotected {
    #[serde(default)]
    x5c: Vec<String>,
    #[serde(rename = "io.cncf.notary.signingAgent", default)]
    _signing_agent: Option<String>,
    #[serde(rename = "io.cncf.notary.timestampSignature", default)]
    timestamp_signature: Option<String>,
}

/// Reads a JWS envelope (JSON serialization, one signature).
pub fn parse_jws(bytes: &[u8]) -> Result<SignedEnvelope, EnvelopeError> {
    // Bounded: no envelope makes ivory build a JSON tree far larger than its bytes.
    let jws: JwsJson = parse_json_bounded(bytes, &JsonLimits::SIGNATURE)
        .map_err(|e| jws_error(format!("not a Notary JWS: {e}")))?;
    let b64url = |field: &str, text: &str| {
        URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|e| jws_error(format!("{field} is not base64url: {e}")))
    };
    let protected_bytes = b64url("protected", &jws.protected)?;
    let payload = b64url("payload", &jws.payload)?;
    let signature = b64url("signature", &jws.signature)?;
    let protected: serde_json::Map<String, Value> =
        parse_json_bounded(&protected_bytes, &JsonLimits::SIGNATURE)
            .map_err(|e| jws_error(format!("protected header is not a JSON object: {e}")))?;
    let text = |key: &str| protected.get(key).and_then(Value::as_str);
    let algorithm = text("alg")
        .and_then(Algorithm::from_jws)
        .ok_or_else(|| jws_error(format!("alg {:?} is not allowed", protected.get("alg"))))?;
    if text("cty") != Some(PAYLOAD_CONTENT_TYPE) {
        return Err(jws_error(format!(
            "cty must be {PAYLOAD_CONTENT_TYPE}, got {:?}",
            protected.get("cty")
        )));
    }
    let crit: Vec<String> = match protected.get("crit") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| jws_error("crit holds a non-string"))?,
        _ => return Err(jws_error("crit is missing")),
    };
    let time = |key: &str| -> Result<Option<Timestamp>, EnvelopeError> {
        protected
            .get(key)
            .map(|v| {
                v.as_str()
                    .and_then(|s| s.parse::<Timestamp>().ok())
                    .ok_or_else(|| jws_error(format!("{key} is not an RFC 3339 time")))
            })
            .transpose()
    };
    let attributes = Attributes {
        scheme: text(SIGNING_SCHEME),
        signing_time: time(SIGNING_TIME)?,
        authentic_signing_time: time(AUTHENTIC_SIGNING_TIME)?,
        expiry: time(EXPIRY)?,
        crit: &crit,
    };
    let scheme = attributes.check().map_err(|e| jws_error(e.to_string()))?;
    if jws.header.x5c.len() > MAX_CHAIN {
        return Err(jws_error(format!(
            "x5c holds more than {MAX_CHAIN} certificates"
        )));
    }
    let chain = jws
        .header
        .x5c
        .iter()
        .map(|c| {
            STANDARD
                .decode(c)
                .map_err(|e| jws_error(format!("x5c entry is not base64: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let timestamp_token = jws
        .header
        .timestamp_signature
        .map(|t| {
            STANDARD
                .decode(t)
                .map_err(|e| jws_error(format!("{TIMESTAMP_SIGNATURE} is not base64: {e}")))
        })
        .transpose()?;
    let mut signed_bytes = jws.protected.into_bytes();
    signed_bytes.push(b'.');
    signed_bytes.extend_from_slice(jws.payload.as_bytes());
    Ok(SignedEnvelope {
        format: Format::Jws,
        algorithm,
        signed_bytes,
        signature,
        payload,
        chain,
        scheme,
        signing_time: attributes.signing_time,
        authentic_signing_time: attributes.authentic_signing_time,
        expiry: attributes.expiry,
        timestamp_token,
    })
}

/// The signed attributes both formats share, checked the same way.
struct Attributes<'a> {
    scheme: Option<&'a str>,
    signing_time: Option<Timestamp>,
    authentic_signing_time: Option<Timestamp>,
    expiry: Option<Timestamp>,
    crit: &'a [String],
}

/// Why the signed attributes are refused; the text follows the envelope's format in the
/// [`EnvelopeError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum AttributeError {
    /// `crit` names a header whose meaning ivory does not know, so it cannot honour it.
    #[error("critical header {header} is not supported")]
    UnsupportedCritical { header: String },
    /// A header the specification makes critical is not in `crit`.
    #[error("{header} is not marked critical")]
    NotCritical { header: &'static str },
    /// A signing scheme other than the specification's two, or none.
    #[error("{SIGNING_SCHEME} {scheme:?} is not supported")]
    UnsupportedScheme { scheme: Option<String> },
    /// The signing time the scheme needs is absent.
    #[error("{header} is missing")]
    MissingTime { header: &'static str },
}

impl Attributes<'_> {
    fn check(&self) -> Result<SigningScheme, AttributeError> {
        let critical = |key: &str| self.crit.iter().any(|c| c == key);
        let not_critical = |header| Err(AttributeError::NotCritical { header });
        for c in self.crit {
            if !matches!(
                c.as_str(),
                SIGNING_SCHEME | EXPIRY | AUTHENTIC_SIGNING_TIME | "alg" | "cty" | "crit"
            ) {
                return Err(AttributeError::UnsupportedCritical { header: c.clone() });
            }
        }
        if !critical(SIGNING_SCHEME) {
            return not_critical(SIGNING_SCHEME);
        }
        if self.expiry.is_some() && !critical(EXPIRY) {
            return not_critical(EXPIRY);
        }
        let scheme = match self.scheme {
            Some("notary.x509") => SigningScheme::X509,
            Some("notary.x509.signingAuthority") => SigningScheme::SigningAuthority,
            other => {
                return Err(AttributeError::UnsupportedScheme {
                    scheme: other.map(str::to_owned),
                });
            }
        };
        let missing = |header| Err(AttributeError::MissingTime { header });
        match scheme {
            SigningScheme::X509 if self.signing_time.is_none() => missing(SIGNING_TIME),
            SigningScheme::SigningAuthority if self.authentic_signing_time.is_none() => {
                missing(AUTHENTIC_SIGNING_TIME)
            }
            SigningScheme::SigningAuthority if !critical(AUTHENTIC_SIGNING_TIME) => {
                not_critical(AUTHENTIC_SIGNING_TIME)
            }
            _ => Ok(scheme),
        }
    }
}

/// Reads a COSE_Sign1 envelope (tagged, payload attached).
pub fn parse_cose(bytes: &[u8]) -> Result<SignedEnvelope, EnvelopeError> {
    let sign1 = CoseSign1::from_tagged_slice(bytes)
        .map_err(|e| cose_error(format!("not a tagged COSE_Sign1: {e}")))?;
    let header = &sign1.protected.header;
    let algorithm = header
        .alg
        .as_ref()
        .and_then(Algorithm::from_cose)
        .ok_or_else(|| cose_error(format!("alg {:?} is not allowed", header.alg)))?;
    match &header.content_type {
        Some(coset::RegisteredLabel::Text(t)) if t == PAYLOAD_CONTENT_TYPE => {}
        other => {
            return Err(cose_error(format!(
                "content type must be {PAYLOAD_CONTENT_TYPE}, got {other:?}"
            )));
        }
    }
    let crit: Vec<String> = header
        .crit
        .iter()
        .map(|c| match c {
            RegisteredLabelWithPrivate::Text(t) => Ok(t.clone()),
            RegisteredLabelWithPrivate::Assigned(iana::HeaderParameter::Alg) => Ok("alg".into()),
            RegisteredLabelWithPrivate::Assigned(iana::HeaderParameter::ContentType) => {
                Ok("cty".into())
            }
            other => Err(cose_error(format!(
                "critical header {other:?} is not supported"
            ))),
        })
        .collect::<Result<_, _>>()?;
    let find = |key: &str| {
        header
            .rest
            .iter()
            .find(|(l, _)| matches!(l, Label::Text(t) if t == key))
            .map(|(_, v)| v)
    };
    let time = |key: &str| -> Result<Option<Timestamp>, EnvelopeError> {
        find(key)
            .map(|v| cose_time(v).ok_or_else(|| cose_error(format!("{key} is not a CBOR time"))))
            .transpose()
    };
    let scheme_text = find(SIGNING_SCHEME).and_then(Cbor::as_text);
    let attributes = Attributes {
        scheme: scheme_text,
        signing_time: time(SIGNING_TIME)?,
        authentic_signing_time: time(AUTHENTIC_SIGNING_TIME)?,
        expiry: time(EXPIRY)?,
        crit: &crit,
    };
    let scheme = attributes.check().map_err(|e| cose_error(e.to_string()))?;
    let mut chain = Vec::new();
    let mut timestamp_token = None;
    for (label, value) in &sign1.unprotected.rest {
        match label {
            Label::Int(X5CHAIN) => chain = cose_chain(value)?,
            Label::Text(t) if t == SIGNING_AGENT => {}
            Label::Text(t) if t == TIMESTAMP_SIGNATURE => {
                let token = value
                    .as_bytes()
                    .ok_or_else(|| cose_error(format!("{TIMESTAMP_SIGNATURE} is not a bstr")))?;
                timestamp_token = Some(token.clone());
            }
            other => {
                return Err(cose_error(format!(
                    "unprotected header {other:?} is not allowed"
                )));
            }
        }
    }
    let payload = sign1
        .payload
        .clone()
        .ok_or_else(|| cose_error("payload is detached"))?;
    let signed_bytes = sign1.tbs_data(&[]);
    Ok(SignedEnvelope {
        format: Format::Cose,
        algorithm,
        signed_bytes,
        signature: sign1.signature,
        payload,
        chain,
        scheme,
        signing_time: attributes.signing_time,
        authentic_signing_time: attributes.authentic_signing_time,
        expiry: attributes.expiry,
        timestamp_token,
    })
}

/// `x5chain`: one bstr or an array of them.
fn cose_chain(value: &Cbor) -> Result<Vec<Vec<u8>>, EnvelopeError> {
    let items = match value {
        Cbor::Bytes(b) => return Ok(vec![b.clone()]),
        Cbor::Array(items) => items,
        _ => return Err(cose_error("x5chain is neither a bstr nor an array")),
    };
    if items.len() > MAX_CHAIN {
        return Err(cose_error(format!(
            "x5chain holds more than {MAX_CHAIN} certificates"
        )));
    }
    items
        .iter()
        .map(|c| {
            c.as_bytes()
                .cloned()
                .ok_or_else(|| cose_error("x5chain entry is not a bstr"))
        })
        .collect()
}

/// A CBOR epoch time (tag 1 around an integer), as notation writes its times.
fn cose_time(value: &Cbor) -> Option<Timestamp> {
    let Cbor::Tag(1, inner) = value else {
        return None;
    };
    let seconds = i64::try_from(inner.as_integer()?).ok()?;
    Timestamp::from_second(seconds).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const JWS: &str = r#"{"payload":"eyJ0YXJnZXRBcnRpZmFjdCI6e319","protected":"PROTECTED","header":{"x5c":[]},"signature":"AAAA"}"#;

    fn jws_with(protected: &str) -> Vec<u8> {
        JWS.replace("PROTECTED", &URL_SAFE_NO_PAD.encode(protected))
            .into_bytes()
    }

    #[test]
    fn jws_protected_headers_are_checked() {
        let good = r#"{"alg":"ES256","crit":["io.cncf.notary.signingScheme"],"cty":"application/vnd.cncf.notary.payload.v1+json","io.cncf.notary.signingScheme":"notary.x509","io.cncf.notary.signingTime":"2026-12-04T17:46:52Z"}"#;
        let env = parse_jws(&jws_with(good)).unwrap();
        assert_eq!(env.algorithm, Algorithm::Es256);
        assert_eq!(env.scheme, SigningScheme::X509);
        let cases = [
            (good.replace("ES256", "RS256"), "alg"),
            (good.replace("notary.payload.v1", "other"), "cty"),
            (
                good.replace(r#""crit":["io.cncf.notary.signingScheme"],"#, ""),
                "crit is missing",
            ),
            (
                good.replace(r#"["io.cncf.notary.signingScheme"]"#, r#"["io.cncf.notary.signingScheme","x-unknown"]"#),
                "not supported",
            ),
            (
                good.replace(r#","io.cncf.notary.signingTime":"2026-12-04T17:46:52Z""#, ""),
                "signingTime is missing",
            ),
            (good.replace("notary.x509", "notary.other"), "not supported"),
            (
                good.replace(
                    r#""io.cncf.notary.signingScheme":"notary.x509","#,
                    r#""io.cncf.notary.signingScheme":"notary.x509","io.cncf.notary.expiry":"2030-01-01T00:00:00Z","#,
                ),
                "expiry is not marked critical",
            ),
            (
                good.replace(
                    r#""io.cncf.notary.signingScheme":"notary.x509""#,
                    r#""io.cncf.notary.signingScheme":"notary.x509.signingAuthority""#,
                ),
                "authenticSigningTime is missing",
            ),
        ];
        for (protected, want) in cases {
            let err = parse_jws(&jws_with(&protected)).unwrap_err().to_string();
            assert!(err.contains(want), "{protected}: {err}");
        }
        // The signed attributes' refusals, word for word as the rejection shows them.
        for (protected, want) in [
            (
                good.replace(
                    r#"["io.cncf.notary.signingScheme"]"#,
                    r#"["io.cncf.notary.signingScheme","x-unknown"]"#,
                ),
                "JWS envelope: critical header x-unknown is not supported",
            ),
            (
                good.replace(r#""crit":["io.cncf.notary.signingScheme"]"#, r#""crit":[]"#),
                "JWS envelope: io.cncf.notary.signingScheme is not marked critical",
            ),
            (
                good.replace("notary.x509", "notary.other"),
                r#"JWS envelope: io.cncf.notary.signingScheme Some("notary.other") is not supported"#,
            ),
            (
                good.replace(
                    r#","io.cncf.notary.signingTime":"2026-12-04T17:46:52Z""#,
                    "",
                ),
                "JWS envelope: io.cncf.notary.signingTime is missing",
            ),
        ] {
            let err = parse_jws(&jws_with(&protected)).unwrap_err().to_string();
            assert_eq!(err, want, "{protected}");
        }
        // An unprotected header the specification does not define is refused.
        let extra = String::from_utf8(jws_with(good))
            .unwrap()
            .replace(r#""x5c":[]"#, r#""x5c":[],"kid":"k""#);
        assert!(parse_jws(extra.as_bytes()).is_err());
        assert!(parse_jws(b"[]").is_err());
        assert!(parse_cose(b"\xd2\x84").is_err());
        assert!(parse("text/plain", b"{}").is_err());
    }

    #[test]
    fn ballooning_json_is_refused_before_a_tree_is_built() {
        // 20,000 empty objects: more than JsonLimits::SIGNATURE allows, in a few dozen KiB.
        let objects = format!("[{}{{}}]", "{},".repeat(20_000));
        let envelope = format!(
            r#"{{"payload":"","protected":"","signature":"","header":{{"x5c":[],"x":{objects}}}}}"#
        );
        let err = parse_jws(envelope.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("objects"), "{err}");
        let protected = format!(r#"{{"alg":"ES256","x":{objects}}}"#);
        let err = parse_jws(&jws_with(&protected)).unwrap_err().to_string();
        assert!(err.contains("protected header"), "{err}");
        assert!(err.contains("objects"), "{err}");
    }
}

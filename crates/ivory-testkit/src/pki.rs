//! A throwaway CA, a server certificate for 127.0.0.1, and an ES256 token-signing key.

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair,
};
use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256,
};

use crate::error::{Error, Result};

fn pki(e: impl std::fmt::Display) -> Error {
    Error::Pki(e.to_string())
}

/// A CA plus one leaf for `127.0.0.1`/`localhost`, all PEM.
pub struct TestPki {
    /// CA certificate (give this to clients as `--registry-ca`).
    pub ca_pem: String,
    /// Server certificate chain (leaf then CA).
    pub server_chain_pem: String,
    /// Server private key (PKCS#8).
    pub server_key_pem: String,
}

impl TestPki {
    /// Generates a fresh CA and server certificate.
    pub fn generate(ca_name: &str) -> Result<Self> {
        let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(pki)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(pki)?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, ca_name);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).map_err(pki)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(pki)?;
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .map_err(pki)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = params.signed_by(&server_key, &issuer).map_err(pki)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            server_chain_pem: format!("{}{}", server_cert.pem(), ca_cert.pem()),
            server_key_pem: server_key.serialize_pem(),
        })
    }
}

/// ES256 key whose self-signed certificate is the registry's `rootcertbundle`; tokens carry
/// the certificate in `x5c`, which Distribution verifies against that bundle.
pub struct TokenSigner {
    key: EcdsaKeyPair,
    cert_der_b64: String,
    /// PEM of the signing certificate (the registry's `rootcertbundle`).
    pub cert_pem: String,
}

impl TokenSigner {
    /// Generates a key and its self-signed certificate.
    pub fn generate() -> Result<Self> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(pki)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "ivory-testkit token signer");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
        ];
        let cert = params.self_signed(&key).map_err(pki)?;
        let signer =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &key.serialize_der())
                .map_err(pki)?;
        Ok(Self {
            key: signer,
            cert_der_b64: base64::engine::general_purpose::STANDARD.encode(cert.der()),
            cert_pem: cert.pem(),
        })
    }

    /// Signs a JWT with `claims` (ES256, `x5c` header).
    pub fn sign(&self, claims: &serde_json::Value) -> Result<String> {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [self.cert_der_b64]});
        let signing_input = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string())
        );
        let sig = self
            .key
            .sign(&SystemRandom::new(), signing_input.as_bytes())
            .map_err(pki)?;
        Ok(format!("{signing_input}.{}", b64.encode(sig.as_ref())))
    }
}

/// A cosign-style ECDSA P-256 key (SHA-256, ASN.1 DER signatures) for signing test
/// signatures and attestations that a key attestor with [`Self::public_pem`] accepts.
pub struct CosignSigner {
    key: EcdsaKeyPair,
    /// The public key (SPKI PEM), as a Kyverno key attestor takes it.
    pub public_pem: String,
}

impl CosignSigner {
    /// Generates a fresh key.
    pub fn generate() -> Result<Self> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(pki)?;
        let signer =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &key.serialize_der())
                .map_err(pki)?;
        Ok(Self {
            key: signer,
            public_pem: key.public_key_pem(),
        })
    }

    /// Signs `data`.
    pub fn sign(&self, data: &[u8]) -> Result<Vec<u8>> {
        let sig = self.key.sign(&SystemRandom::new(), data).map_err(pki)?;
        Ok(sig.as_ref().to_vec())
    }

    /// A DSSE envelope (JSON bytes) over `payload`, signed with this key as cosign
    /// `attest` does.
    pub fn dsse(&self, payload_type: &str, payload: &[u8]) -> Result<Vec<u8>> {
        let mut pae = format!(
            "DSSEv1 {} {payload_type} {} ",
            payload_type.len(),
            payload.len()
        )
        .into_bytes();
        pae.extend_from_slice(payload);
        let b64 = base64::engine::general_purpose::STANDARD;
        let envelope = serde_json::json!({
            "payloadType": payload_type,
            "payload": b64.encode(payload),
            "signatures": [{ "keyid": "", "sig": b64.encode(self.sign(&pae)?) }],
        });
        Ok(envelope.to_string().into_bytes())
    }
}

//! A test Rekor v2 log: an Ed25519 key that signs checkpoints (C2SP signed notes), a small
//! RFC 6962 Merkle tree holding the logged body among filler leaves, and the bundle and
//! trusted-root JSON that name it. Real crypto (aws-lc-rs, sha2), for tests only.

use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair as _};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rcgen::{KeyPair, PKCS_ED25519, PublicKeyData as _};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};

/// Leaves in every test tree; the logged body is at [`LOGGED_INDEX`].
pub const TREE_SIZE: u64 = 7;
/// Where the logged body sits in the test tree (not a power of two, so its proof has
/// hashes of both sides and of an unbalanced subtree).
pub const LOGGED_INDEX: u64 = 5;

/// A Rekor v2 log identity: origin line and Ed25519 checkpoint key.
pub struct RekorV2Log {
    origin: String,
    key: Ed25519KeyPair,
    spki_der: Vec<u8>,
    key_id: [u8; 32],
}

/// Who a `dsse/0.0.2` entry names as the envelope's verifier.
#[derive(Clone, Copy, Debug)]
pub enum DsseVerifier<'a> {
    /// A signing certificate (DER).
    Certificate(&'a [u8]),
    /// A public key (SPKI DER).
    PublicKey(&'a [u8]),
}

impl RekorV2Log {
    /// A fresh log named `origin` (its checkpoints' first line).
    pub fn generate(origin: &str) -> Result<Self> {
        let pair = KeyPair::generate_for(&PKCS_ED25519).map_err(pki)?;
        let key = Ed25519KeyPair::from_pkcs8(&pair.serialize_der()).map_err(pki)?;
        // C2SP signed-note key ID: SHA-256(name || "\n" || 0x01 || raw Ed25519 key).
        let mut id = Sha256::new();
        id.update(origin.as_bytes());
        id.update(b"\n\x01");
        id.update(key.public_key().as_ref());
        Ok(Self {
            origin: origin.to_owned(),
            spki_der: pair.subject_public_key_info(),
            key_id: id.finalize().into(),
            key,
        })
    }

    /// The log's ID (the signed-note key ID), as the trusted root and entries name it.
    pub fn key_id(&self) -> [u8; 32] {
        self.key_id
    }

    /// The trusted root's `tlogs` element for this log, valid from `start` (RFC 3339) to `end`.
    pub fn trusted_root_tlog(&self, start: &str, end: Option<&str>) -> Value {
        let mut valid_for = json!({ "start": start });
        if let Some(end) = end {
            valid_for["end"] = json!(end);
        }
        json!({
            "baseUrl": format!("https://{}", self.origin),
            "hashAlgorithm": "SHA2_256",
            "publicKey": {
                "rawBytes": STANDARD.encode(&self.spki_der),
                "keyDetails": "PKIX_ED25519",
                "validFor": valid_for,
            },
            "logId": { "keyId": STANDARD.encode(self.key_id) },
        })
    }

    /// The checkpoint note for a tree of `size` leaves with `root`, signed by this log.
    pub fn checkpoint(&self, size: u64, root: &[u8; 32]) -> String {
        let body = format!("{}\n{size}\n{}\n", self.origin, STANDARD.encode(root));
        let mut signed = self.key_id[..4].to_vec();
        signed.extend_from_slice(self.key.sign(body.as_bytes()).as_ref());
        format!(
            "{body}\n\u{2014} {} {}\n",
            self.origin,
            STANDARD.encode(signed)
        )
    }

    /// The bundle's `tlogEntries` element logging `body` as `kind`/`version` at
    /// [`LOGGED_INDEX`] of a [`TREE_SIZE`]-leaf tree, with its inclusion proof and a
    /// checkpoint signed by this log. Rekor v2: no integrated time, no promise.
    pub fn entry(&self, kind: &str, version: &str, body: &[u8]) -> Value {
        let leaves: Vec<[u8; 32]> = (0..TREE_SIZE)
            .map(|i| {
                if i == LOGGED_INDEX {
                    leaf_hash(body)
                } else {
                    leaf_hash(format!("filler {i}").as_bytes())
                }
            })
            .collect();
        let root = tree_hash(&leaves);
        let proof: Vec<String> = audit_path(LOGGED_INDEX as usize, &leaves)
            .iter()
            .map(|h| STANDARD.encode(h))
            .collect();
        json!({
            "logIndex": LOGGED_INDEX.to_string(),
            "logId": { "keyId": STANDARD.encode(self.key_id) },
            "kindVersion": { "kind": kind, "version": version },
            "inclusionProof": {
                "logIndex": LOGGED_INDEX.to_string(),
                "rootHash": STANDARD.encode(root),
                "treeSize": TREE_SIZE.to_string(),
                "hashes": proof,
                "checkpoint": { "envelope": self.checkpoint(TREE_SIZE, &root) },
            },
            "canonicalizedBody": STANDARD.encode(body),
        })
    }
}

/// The canonicalized body Rekor v2 logs for a DSSE envelope (`dsse/0.0.2`): the SHA-256 of
/// its payload, and its signature with the verifier.
pub fn dsse_v002_body(payload: &[u8], signature: &[u8], verifier: DsseVerifier<'_>) -> Vec<u8> {
    let verifier = match verifier {
        DsseVerifier::Certificate(der) => {
            json!({ "x509Certificate": { "rawBytes": STANDARD.encode(der) },
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256" })
        }
        DsseVerifier::PublicKey(der) => {
            json!({ "publicKey": { "rawBytes": STANDARD.encode(der) },
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256" })
        }
    };
    json!({
        "apiVersion": "0.0.2",
        "kind": "dsse",
        "spec": { "dsseV002": {
            "payloadHash": {
                "algorithm": "SHA2_256",
                "digest": STANDARD.encode(Sha256::digest(payload)),
            },
            "signatures": [{ "content": STANDARD.encode(signature), "verifier": verifier }],
        }},
    })
    .to_string()
    .into_bytes()
}

fn pki(e: impl std::fmt::Display) -> Error {
    Error::Pki(e.to_string())
}

/// RFC 6962 §2.1: leaf hash.
fn leaf_hash(data: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    h.finalize().into()
}

fn node_hash(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The largest power of two below `n` (n > 1).
fn split(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// RFC 6962 §2.1: MTH over leaf hashes.
fn tree_hash(leaves: &[[u8; 32]]) -> [u8; 32] {
    match leaves {
        [one] => *one,
        _ => {
            let k = split(leaves.len());
            node_hash(&tree_hash(&leaves[..k]), &tree_hash(&leaves[k..]))
        }
    }
}

/// RFC 6962 §2.1.1: PATH(m, D[n]), leaf to root.
fn audit_path(m: usize, leaves: &[[u8; 32]]) -> Vec<[u8; 32]> {
    if leaves.len() <= 1 {
        return Vec::new();
    }
    let k = split(leaves.len());
    if m < k {
        let mut path = audit_path(m, &leaves[..k]);
        path.push(tree_hash(&leaves[k..]));
        path
    } else {
        let mut path = audit_path(m - k, &leaves[k..]);
        path.push(tree_hash(&leaves[..k]));
        path
    }
}

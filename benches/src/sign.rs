//! Synthetic cosign-signed images: a P-256 key made for the run, images that share their
//! blobs (only the manifest annotation differs, so every digest is distinct), and cosign
//! "simple signing" signatures in the `sha256-<hex>.sig` tag layout that `cosign sign
//! --tlog-upload=false` writes. Thousands of distinct signed images are needed for the cache
//! figures; signing them with the cosign CLI would take far longer than the benchmark.

use anyhow::{Context as _, Result, anyhow, bail};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures::{StreamExt as _, TryStreamExt as _};
use ivory_testkit::{OCI_CONFIG, OCI_LAYER, OCI_MANIFEST, sha256_digest};
use serde_json::{Value, json};

/// DER prefix of a P-256 SubjectPublicKeyInfo (ecPublicKey, prime256v1, BIT STRING of 66).
const P256_SPKI_PREFIX: &str = "3059301306072a8648ce3d020106082a8648ce3d030107034200";
const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// A throwaway cosign key pair.
pub(crate) struct BenchKey {
    pair: EcdsaKeyPair,
    rng: SystemRandom,
}

impl BenchKey {
    pub(crate) fn generate() -> Result<Self> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|_| anyhow!("generating the bench P-256 key"))?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref())
            .map_err(|_| anyhow!("loading the bench P-256 key"))?;
        Ok(Self { pair, rng })
    }

    /// `-----BEGIN PUBLIC KEY-----` PEM, as `cosign generate-key-pair` writes it.
    pub(crate) fn public_pem(&self) -> Result<String> {
        let mut der = hex::decode(P256_SPKI_PREFIX).context("SPKI prefix")?;
        der.extend_from_slice(self.pair.public_key().as_ref());
        let b64 = STANDARD.encode(der);
        let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(chunk));
            pem.push('\n');
        }
        pem.push_str("-----END PUBLIC KEY-----\n");
        Ok(pem)
    }

    /// Base64 ASN.1 ECDSA/SHA-256 signature of `payload`.
    fn sign(&self, payload: &[u8]) -> Result<String> {
        let sig = self
            .pair
            .sign(&self.rng, payload)
            .map_err(|_| anyhow!("signing a payload"))?;
        Ok(STANDARD.encode(sig.as_ref()))
    }
}

/// One pushed image.
#[derive(Clone, Debug)]
pub(crate) struct Image {
    /// `HOST/REPO`.
    pub name: String,
    pub tag: String,
    pub digest: String,
}

impl Image {
    pub(crate) fn tag_ref(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }
    pub(crate) fn digest_ref(&self) -> String {
        format!("{}@{}", self.name, self.digest)
    }
    /// What the mutating webhook turns a tag into.
    pub(crate) fn pinned_ref(&self) -> String {
        format!("{}:{}@{}", self.name, self.tag, self.digest)
    }
}

/// Pushes over one shared HTTPS client (the testkit helpers open a client per call, too slow
/// for thousands of images).
pub(crate) struct Pusher {
    client: reqwest::Client,
    base: String,
    host: String,
}

/// Blobs every image of a repository shares.
struct Shared {
    config: Value,
    layer: Value,
    sig_config: Value,
}

impl Pusher {
    pub(crate) fn new(host: &str, ca_pem: &str) -> Result<Self> {
        let cert = reqwest::Certificate::from_pem(ca_pem.as_bytes()).context("registry CA")?;
        let client = reqwest::Client::builder()
            .tls_certs_merge([cert])
            .build()
            .context("building the push client")?;
        Ok(Self {
            client,
            base: format!("https://{host}"),
            host: host.to_owned(),
        })
    }

    /// Pushes `count` distinct images signed by `key` into `repo`, `concurrency` at a time.
    pub(crate) async fn signed_images(
        &self,
        repo: &str,
        count: usize,
        key: &BenchKey,
        concurrency: usize,
    ) -> Result<Vec<Image>> {
        let shared = self.shared(repo).await?;
        futures::stream::iter(0..count)
            .map(|n| self.signed_image(repo, &shared, n, key))
            .buffered(concurrency.max(1))
            .try_collect()
            .await
    }

    async fn shared(&self, repo: &str) -> Result<Shared> {
        let config = json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Labels": {"repo": repo}},
            "rootfs": {"type": "layers", "diff_ids": []},
        });
        let config = self
            .blob(repo, OCI_CONFIG, config.to_string().into_bytes())
            .await?;
        let layer = self
            .blob(
                repo,
                OCI_LAYER,
                format!("ivory bench layer {repo}\n").into_bytes(),
            )
            .await?;
        let sig_config = json!({
            "architecture": "", "os": "", "config": {},
            "rootfs": {"type": "layers", "diff_ids": []},
        });
        let sig_config = self
            .blob(repo, OCI_CONFIG, sig_config.to_string().into_bytes())
            .await?;
        Ok(Shared {
            config,
            layer,
            sig_config,
        })
    }

    async fn signed_image(
        &self,
        repo: &str,
        shared: &Shared,
        n: usize,
        key: &BenchKey,
    ) -> Result<Image> {
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": shared.config,
            "layers": [shared.layer],
            "annotations": {"dev.ivory.bench.seed": n.to_string()},
        });
        let tag = format!("v{n}");
        let digest = self
            .manifest(repo, &tag, manifest.to_string().into_bytes())
            .await?;
        let payload = json!({
            "critical": {
                "identity": {"docker-reference": format!("{}/{repo}", self.host)},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature",
            },
            "optional": null,
        })
        .to_string()
        .into_bytes();
        let signature = key.sign(&payload)?;
        let mut layer = self.blob(repo, SIMPLE_SIGNING, payload).await?;
        layer["annotations"] = json!({ SIGNATURE_ANNOTATION: signature });
        let sig_manifest = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": shared.sig_config,
            "layers": [layer],
        });
        let sig_tag = format!("{}.sig", digest.replace(':', "-"));
        self.manifest(repo, &sig_tag, sig_manifest.to_string().into_bytes())
            .await?;
        Ok(Image {
            name: format!("{}/{repo}", self.host),
            tag,
            digest,
        })
    }

    /// POST + PUT upload; returns the descriptor.
    async fn blob(&self, repo: &str, media_type: &str, bytes: Vec<u8>) -> Result<Value> {
        let digest = sha256_digest(&bytes);
        let url = format!("{}/v2/{repo}/blobs/uploads/", self.base);
        let res = self
            .client
            .post(&url)
            .header("Content-Length", "0")
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        if res.status().as_u16() != 202 {
            bail!("POST {url}: HTTP {}", res.status());
        }
        let location = res
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .with_context(|| format!("POST {url}: no Location"))?;
        let mut put = if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            location.to_owned()
        };
        put.push(if put.contains('?') { '&' } else { '?' });
        put.push_str(&format!("digest={digest}"));
        let size = bytes.len();
        let res = self
            .client
            .put(&put)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(bytes)
            .send()
            .await
            .with_context(|| format!("PUT blob {digest}"))?;
        if res.status().as_u16() != 201 {
            bail!("PUT blob {digest} into {repo}: HTTP {}", res.status());
        }
        Ok(json!({"mediaType": media_type, "size": size, "digest": digest}))
    }

    /// PUT manifest under `reference`; returns its digest.
    async fn manifest(&self, repo: &str, reference: &str, bytes: Vec<u8>) -> Result<String> {
        let digest = sha256_digest(&bytes);
        let url = format!("{}/v2/{repo}/manifests/{reference}", self.base);
        let res = self
            .client
            .put(&url)
            .header(reqwest::header::CONTENT_TYPE, OCI_MANIFEST)
            .body(bytes)
            .send()
            .await
            .with_context(|| format!("PUT {url}"))?;
        if res.status().as_u16() != 201 {
            let status = res.status();
            let body = res.text().await.unwrap_or_default();
            bail!("PUT {url}: HTTP {status}: {body}");
        }
        Ok(digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1, UnparsedPublicKey};

    #[test]
    fn public_pem_is_p256_spki_and_signatures_verify() {
        let key = BenchKey::generate().unwrap();
        let pem = key.public_pem().unwrap();
        let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = STANDARD.decode(b64).unwrap();
        assert_eq!(der.len(), 91);
        assert_eq!(hex::encode(&der[..26]), P256_SPKI_PREFIX);
        let sig = STANDARD.decode(key.sign(b"payload").unwrap()).unwrap();
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &der[26..]);
        assert!(public.verify(b"payload", &sig).is_ok());
        assert!(public.verify(b"other", &sig).is_err());
    }

    #[test]
    fn image_references() {
        let i = Image {
            name: "127.0.0.1:5000/bench/app".into(),
            tag: "v1".into(),
            digest: "sha256:ab".into(),
        };
        assert_eq!(i.tag_ref(), "127.0.0.1:5000/bench/app:v1");
        assert_eq!(i.digest_ref(), "127.0.0.1:5000/bench/app@sha256:ab");
        assert_eq!(i.pinned_ref(), "127.0.0.1:5000/bench/app:v1@sha256:ab");
    }
}

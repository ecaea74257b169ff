//! Pushes content into a harness registry over plain reqwest (test support, not product).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, LOCATION};
use serde_json::Value;

use crate::error::{Error, Result, io};
use crate::layout::{OCI_INDEX, OCI_MANIFEST, REF_NAME, sha256_digest};
use crate::pki::CosignSigner;
use crate::registry::Harness;

/// One manifest of a layout, in push order (children before parents).
struct Node {
    digest: String,
    media_type: String,
    bytes: Vec<u8>,
    blobs: Vec<String>,
}

impl Harness {
    /// Uploads a blob (monolithic POST + PUT) and returns its digest.
    pub async fn push_blob(&self, repo: &str, bytes: &[u8]) -> Result<String> {
        let digest = sha256_digest(bytes);
        let client = self.http_client()?;
        let auth = self.push_authorization(repo)?;
        let url = format!("{}/v2/{repo}/blobs/uploads/", self.base_url());
        let mut req = client.post(&url).header("Content-Length", "0");
        if let Some(a) = &auth {
            req = req.header(AUTHORIZATION, a);
        }
        let res = req.send().await.map_err(http(&url))?;
        if res.status().as_u16() != 202 {
            return Err(Error::Http(format!("POST {url}: HTTP {}", res.status())));
        }
        let location = res
            .headers()
            .get(LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| Error::Http(format!("POST {url}: no Location")))?;
        let mut put_url = if location.starts_with('/') {
            format!("{}{location}", self.base_url())
        } else {
            location.to_string()
        };
        put_url.push(if put_url.contains('?') { '&' } else { '?' });
        put_url.push_str(&format!("digest={digest}"));
        let mut req = client
            .put(&put_url)
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(bytes.to_vec());
        if let Some(a) = &auth {
            req = req.header(AUTHORIZATION, a);
        }
        let res = req.send().await.map_err(http(&put_url))?;
        if res.status().as_u16() != 201 {
            let status = res.status();
            let body = res.text().await.unwrap_or_default();
            return Err(Error::Http(format!(
                "PUT blob {digest}: HTTP {status}: {body}"
            )));
        }
        Ok(digest)
    }

    /// Uploads a manifest under `reference` (tag or digest); returns its digest.
    pub async fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<String> {
        let client = self.http_client()?;
        let url = format!("{}/v2/{repo}/manifests/{reference}", self.base_url());
        let mut req = client
            .put(&url)
            .header(CONTENT_TYPE, media_type)
            .body(bytes.to_vec());
        if let Some(a) = self.push_authorization(repo)? {
            req = req.header(AUTHORIZATION, a);
        }
        let res = req.send().await.map_err(http(&url))?;
        if res.status().as_u16() != 201 {
            let status = res.status();
            let body = res.text().await.unwrap_or_default();
            return Err(Error::Http(format!("PUT {url}: HTTP {status}: {body}")));
        }
        Ok(sha256_digest(bytes))
    }

    /// Signs `digest` in `repo` as `cosign sign --key … --tlog-upload=false` does: a
    /// simple-signing payload naming the digest, its ECDSA signature in the layer annotation
    /// `dev.cosignproject.cosign/signature`, under the tag `sha256-<hex>.sig`.
    pub async fn push_cosign_signature(
        &self,
        repo: &str,
        digest: &str,
        signer: &CosignSigner,
    ) -> Result<()> {
        use base64::Engine as _;
        let payload = serde_json::json!({
            "critical": {
                "identity": {"docker-reference": format!("{}/{repo}", self.host())},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature",
            },
            "optional": null,
        })
        .to_string()
        .into_bytes();
        let signature = base64::engine::general_purpose::STANDARD.encode(signer.sign(&payload)?);
        let config = self.push_blob(repo, b"{}").await?;
        let layer = self.push_blob(repo, &payload).await?;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
            "layers": [{
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                "digest": layer,
                "size": payload.len(),
                "annotations": {"dev.cosignproject.cosign/signature": signature},
            }],
        });
        let tag = format!("{}.sig", digest.replace(':', "-"));
        self.push_manifest(repo, &tag, OCI_MANIFEST, manifest.to_string().as_bytes())
            .await?;
        Ok(())
    }

    /// Pushes a multi-platform image: one small image per `os/architecture` (its config says
    /// that platform) and an OCI index over them, tagged `tag`. Returns the index digest and
    /// the platform manifests' digests, in the order given.
    pub async fn push_platform_index(
        &self,
        repo: &str,
        tag: &str,
        platforms: &[(&str, &str)],
    ) -> Result<(String, Vec<String>)> {
        let mut children = Vec::new();
        let mut entries = Vec::new();
        for (os, architecture) in platforms {
            let config = serde_json::json!({
                "architecture": architecture,
                "os": os,
                "config": {"Labels": {"platform": format!("{os}/{architecture}")}},
                "rootfs": {"type": "layers", "diff_ids": []},
            })
            .to_string();
            let layer = format!("ivory {repo} {os}/{architecture}\n");
            let config_digest = self.push_blob(repo, config.as_bytes()).await?;
            let layer_digest = self.push_blob(repo, layer.as_bytes()).await?;
            let manifest = serde_json::json!({
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len()}],
            })
            .to_string();
            let digest = self
                .push_manifest(
                    repo,
                    &sha256_digest(manifest.as_bytes()),
                    OCI_MANIFEST,
                    manifest.as_bytes(),
                )
                .await?;
            entries.push(serde_json::json!({
                "mediaType": OCI_MANIFEST,
                "digest": digest,
                "size": manifest.len(),
                "platform": {"os": os, "architecture": architecture},
            }));
            children.push(digest);
        }
        let index =
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
                .to_string();
        let digest = self
            .push_manifest(repo, tag, OCI_INDEX, index.as_bytes())
            .await?;
        Ok((digest, children))
    }

    /// Pushes the committed fixture image `fixtures/oci/ivory/<layout>` (see
    /// [`crate::fixtures_dir`]) as `ivory/<layout>`: (`HOST/ivory/<layout>:v1`, its digest).
    pub async fn push_fixture(&self, layout: &str) -> Result<(String, String)> {
        let repo = format!("ivory/{layout}");
        let dir = crate::fixtures_dir().join("oci/ivory").join(layout);
        let tags = self.push_oci_layout(&dir, &repo).await?;
        let digest = tags.get("v1").cloned().ok_or_else(|| Error::Layout {
            path: dir.display().to_string(),
            detail: "no v1 tag".into(),
        })?;
        Ok((format!("{}/{repo}:v1", self.host()), digest))
    }

    /// Pushes an OCI image layout: every blob, then every manifest (children before
    /// parents, by digest), then a tag for each `index.json` entry annotated with
    /// `org.opencontainers.image.ref.name`. A `cosign save` layout names its entries by a
    /// `kind` annotation instead: its signatures and attestations get cosign's tags
    /// (`sha256-<image hex>.sig` / `.att`) and the image the tag `v1`. Returns tag → digest.
    pub async fn push_oci_layout(
        &self,
        dir: &Path,
        repo: &str,
    ) -> Result<BTreeMap<String, String>> {
        let index = read_json(dir, &dir.join("index.json"))?;
        let entries = index
            .get("manifests")
            .and_then(|m| m.as_array())
            .cloned()
            .unwrap_or_default();
        let mut nodes = Vec::new();
        let mut seen = HashSet::new();
        let mut tags = BTreeMap::new();
        for entry in &entries {
            let digest = str_field(dir, entry, "digest")?;
            plan(
                dir,
                &digest,
                entry.get("mediaType"),
                &mut seen,
                &mut nodes,
                0,
            )?;
            if let Some(tag) = entry
                .get("annotations")
                .and_then(|a| a.get(REF_NAME))
                .and_then(|t| t.as_str())
            {
                tags.insert(tag.to_string(), digest);
            }
        }
        tags.extend(cosign_save_tags(&entries));
        let mut pushed_blobs = HashSet::new();
        for node in &nodes {
            for blob in &node.blobs {
                if pushed_blobs.insert(blob.clone()) {
                    self.push_blob(repo, &read_blob(dir, blob)?).await?;
                }
            }
        }
        for node in &nodes {
            self.push_manifest(repo, &node.digest, &node.media_type, &node.bytes)
                .await?;
        }
        for (tag, digest) in &tags {
            let node = nodes
                .iter()
                .find(|n| &n.digest == digest)
                .ok_or_else(|| layout_err(dir, format!("tag {tag} has no manifest")))?;
            self.push_manifest(repo, tag, &node.media_type, &node.bytes)
                .await?;
        }
        Ok(tags)
    }
}

/// cosign's tags for the entries of a `cosign save` layout (annotation `kind`).
fn cosign_save_tags(entries: &[Value]) -> BTreeMap<String, String> {
    let kind = |e: &Value| {
        e.get("annotations")
            .and_then(|a| a.get("kind"))
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let digest = |e: &Value| {
        e.get("digest")
            .and_then(|d| d.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let mut tags = BTreeMap::new();
    let Some(image) = entries.iter().find(|e| {
        matches!(
            kind(e).as_str(),
            "dev.cosignproject.cosign/image" | "dev.cosignproject.cosign/imageIndex"
        )
    }) else {
        return tags;
    };
    let image_digest = digest(image);
    let prefix = image_digest.replace(':', "-");
    tags.insert("v1".to_owned(), image_digest);
    for e in entries {
        let suffix = match kind(e).as_str() {
            "dev.cosignproject.cosign/sigs" => "sig",
            "dev.cosignproject.cosign/atts" => "att",
            _ => continue,
        };
        tags.insert(format!("{prefix}.{suffix}"), digest(e));
    }
    tags
}

/// Depth-first: children land in `nodes` before their parent.
fn plan(
    dir: &Path,
    digest: &str,
    declared: Option<&Value>,
    seen: &mut HashSet<String>,
    nodes: &mut Vec<Node>,
    depth: usize,
) -> Result<()> {
    if depth > 8 {
        return Err(layout_err(
            dir,
            format!("index nesting too deep at {digest}"),
        ));
    }
    if !seen.insert(digest.to_string()) {
        return Ok(());
    }
    let bytes = read_blob(dir, digest)?;
    let json: Value = serde_json::from_slice(&bytes)
        .map_err(|e| layout_err(dir, format!("manifest {digest} is not JSON: {e}")))?;
    let media_type = json
        .get("mediaType")
        .and_then(|m| m.as_str())
        .or_else(|| declared.and_then(|d| d.as_str()))
        .unwrap_or(if json.get("manifests").is_some() {
            OCI_INDEX
        } else {
            OCI_MANIFEST
        })
        .to_string();
    let mut blobs = Vec::new();
    if let Some(children) = json.get("manifests").and_then(|m| m.as_array()) {
        for child in children {
            let d = str_field(dir, child, "digest")?;
            plan(dir, &d, child.get("mediaType"), seen, nodes, depth + 1)?;
        }
    } else {
        if let Some(c) = json.get("config") {
            blobs.push(str_field(dir, c, "digest")?);
        }
        for layer in json
            .get("layers")
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten()
        {
            blobs.push(str_field(dir, layer, "digest")?);
        }
    }
    nodes.push(Node {
        digest: digest.to_string(),
        media_type,
        bytes,
        blobs,
    });
    Ok(())
}

fn read_blob(dir: &Path, digest: &str) -> Result<Vec<u8>> {
    let (alg, hex) = digest
        .split_once(':')
        .ok_or_else(|| layout_err(dir, format!("bad digest {digest}")))?;
    let path = dir.join("blobs").join(alg).join(hex);
    std::fs::read(&path).map_err(io(format!("reading {}", path.display())))
}

fn read_json(dir: &Path, path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| layout_err(dir, format!("{}: {e}", path.display())))
}

fn str_field(dir: &Path, v: &Value, field: &str) -> Result<String> {
    v.get(field)
        .and_then(|f| f.as_str())
        .map(str::to_string)
        .ok_or_else(|| layout_err(dir, format!("descriptor without {field}: {v}")))
}

fn layout_err(dir: &Path, detail: String) -> Error {
    Error::Layout {
        path: dir.display().to_string(),
        detail,
    }
}

fn http(url: &str) -> impl FnOnce(reqwest::Error) -> Error + '_ {
    move |e| Error::Http(format!("{url}: {e}"))
}

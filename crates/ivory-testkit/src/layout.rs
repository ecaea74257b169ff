//! Writes OCI image layouts (`oci-layout`, `index.json`, `blobs/sha256/*`) for tests.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::error::{Result, io};

/// OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index media type.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image config media type.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// OCI uncompressed layer media type.
pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
/// Annotation naming an `index.json` entry's tag.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A content descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Media type.
    pub media_type: String,
    /// `sha256:…`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

impl Descriptor {
    /// JSON form for manifests and indexes.
    pub fn to_json(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
    }
}

/// sha256 digest string.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// Builder for an OCI layout directory.
pub struct OciLayout {
    dir: PathBuf,
    entries: Vec<Value>,
}

impl OciLayout {
    /// Creates `dir` with `oci-layout` and an empty blob store.
    pub fn create(dir: &Path) -> Result<Self> {
        let blobs = dir.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs).map_err(io(format!("creating {}", blobs.display())))?;
        let marker = dir.join("oci-layout");
        std::fs::write(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#)
            .map_err(io(format!("writing {}", marker.display())))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            entries: Vec::new(),
        })
    }

    /// Layout directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stores a blob.
    pub fn add_blob(&self, media_type: &str, bytes: &[u8]) -> Result<Descriptor> {
        let digest = sha256_digest(bytes);
        let hex = digest.trim_start_matches("sha256:");
        let path = self.dir.join("blobs").join("sha256").join(hex);
        std::fs::write(&path, bytes).map_err(io(format!("writing {}", path.display())))?;
        Ok(Descriptor {
            media_type: media_type.to_string(),
            digest,
            size: bytes.len() as u64,
        })
    }

    /// Stores a manifest or index given as JSON (serialized compactly).
    pub fn add_json(&self, media_type: &str, body: &Value) -> Result<Descriptor> {
        self.add_blob(media_type, body.to_string().as_bytes())
    }

    /// Stores a config blob, layers and an OCI image manifest referencing them.
    pub fn add_image(
        &self,
        config: &[u8],
        layers: &[&[u8]],
        annotations: Option<Value>,
    ) -> Result<Descriptor> {
        let config = self.add_blob(OCI_CONFIG, config)?;
        let layers: Vec<Value> = layers
            .iter()
            .map(|l| self.add_blob(OCI_LAYER, l).map(|d| d.to_json()))
            .collect::<Result<_>>()?;
        let mut manifest = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config.to_json(),
            "layers": layers,
        });
        if let Some(a) = annotations {
            manifest["annotations"] = a;
        }
        self.add_json(OCI_MANIFEST, &manifest)
    }

    /// Stores an OCI index over `children` (each with an optional platform).
    pub fn add_index(&self, children: &[(Descriptor, Option<Value>)]) -> Result<Descriptor> {
        let manifests: Vec<Value> = children
            .iter()
            .map(|(d, platform)| {
                let mut v = d.to_json();
                if let Some(p) = platform {
                    v["platform"] = p.clone();
                }
                v
            })
            .collect();
        let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests});
        self.add_json(OCI_INDEX, &index)
    }

    /// Lists `desc` in `index.json`, tagged when `tag` is given.
    pub fn add_entry(&mut self, desc: &Descriptor, tag: Option<&str>) {
        let mut v = desc.to_json();
        if let Some(t) = tag {
            v["annotations"] = json!({ REF_NAME: t });
        }
        self.entries.push(v);
    }

    /// Writes `index.json`.
    pub fn finish(&self) -> Result<()> {
        let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.entries});
        let path = self.dir.join("index.json");
        std::fs::write(&path, index.to_string()).map_err(io(format!("writing {}", path.display())))
    }
}

/// The parts of a one-layer test image.
#[derive(Clone, Debug)]
pub struct SimpleImage {
    /// Image manifest.
    pub manifest: Descriptor,
    /// Config blob.
    pub config: Descriptor,
    /// The single layer.
    pub layer: Descriptor,
}

/// Writes a layout holding one image (config + one layer) tagged `tag`; `seed` makes
/// the content, and so the digests, unique.
pub fn write_simple_image(dir: &Path, tag: &str, seed: &str) -> Result<SimpleImage> {
    let mut layout = OciLayout::create(dir)?;
    let config_bytes = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {"seed": seed}},
        "rootfs": {"type": "layers", "diff_ids": []},
    })
    .to_string();
    let layer_bytes = format!("ivory test layer {seed}\n");
    let config = layout.add_blob(OCI_CONFIG, config_bytes.as_bytes())?;
    let layer = layout.add_blob(OCI_LAYER, layer_bytes.as_bytes())?;
    let manifest = layout.add_json(
        OCI_MANIFEST,
        &json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config.to_json(),
            "layers": [layer.to_json()],
        }),
    )?;
    layout.add_entry(&manifest, Some(tag));
    layout.finish()?;
    Ok(SimpleImage {
        manifest,
        config,
        layer,
    })
}

//! Image data for the CEL `image` context (`image.GetMetadata`): the manifest (and the index
//! it came from) and the config of an image, by digest.

use ivory_engine::verifier::{ImagePlatform, ImageReference, VerifyError};
use ivory_registry::{Credentials, JsonLimits, parse_json_bounded};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::CosignVerifier;
use crate::classify::map_error;

impl CosignVerifier {
    /// The image data of `image`, fetched by the digest its tag resolves to; from an index,
    /// the manifest for `platform`.
    pub(super) async fn image_data_inner(
        &self,
        reference: &ImageReference,
        creds: &Credentials,
        platform: &ImagePlatform,
        deadline: Instant,
    ) -> Result<Value, VerifyError> {
        let image = reference.original();
        let fail = |operation: &str, e| map_error(reference, operation, e, deadline);
        let digest = self.resolve(reference, creds, deadline).await?;
        let registry = &self.inner.registry;
        let pinned = super::sibling(reference.repository_name(), '@', &digest)
            .map_err(|e| fail("fetching the manifest", e))?;
        let top = registry
            .fetch_manifest(&pinned, creds, deadline)
            .await
            .map_err(|e| fail("fetching the manifest", e))?;
        let (index, manifest) = if top.is_index() {
            let (os, architecture) = described_platform(&top.json, platform);
            let wanted = ivory_registry::Platform {
                os,
                architecture,
                variant: None,
            };
            let operation = format!(
                "fetching the {}/{} manifest of the index",
                wanted.os, wanted.architecture
            );
            let m = registry
                .fetch_platform_manifest(&pinned, &wanted, creds, deadline)
                .await
                .map_err(|e| fail(&operation, e))?;
            (Some(top.json.clone()), m)
        } else {
            (None, top)
        };
        let config = match manifest
            .json
            .pointer("/config/digest")
            .and_then(Value::as_str)
        {
            Some(d) => {
                let bytes = registry
                    .fetch_blob(
                        &pinned,
                        d,
                        self.inner.config.max_signature_bytes,
                        creds,
                        deadline,
                    )
                    .await
                    .map_err(|e| fail("fetching the config", e))?;
                image_config(image, reference.registry(), &bytes)?
            }
            None => Value::Null,
        };
        Ok(describe(
            image,
            reference,
            &digest,
            index,
            manifest.json,
            config,
        ))
    }
}

/// The platform whose manifest describes an index for a workload on `platform`: that one when
/// the index has it; else the only runnable manifest the workload can run (an arm64-only or
/// Windows-only image on a Pod that does not pin another platform: the kubelet can pull
/// nothing else); else `platform`, which the index lacks (an error naming it).
fn described_platform(index: &Value, platform: &ImagePlatform) -> (String, String) {
    let written = written_platforms(index);
    let has = |os: &str, arch: &str| written.iter().any(|&(o, a)| o == os && a == arch);
    if !has(&platform.os, &platform.architecture) {
        let mut possible = written
            .iter()
            .filter(|(os, arch)| platform.allowed.contains(os, arch));
        if let (Some((os, arch)), None) = (possible.next(), possible.next()) {
            return ((*os).to_owned(), (*arch).to_owned());
        }
    }
    (platform.os.clone(), platform.architecture.clone())
}

/// The platforms an index's entries name, as written: image data picks a manifest by them as
/// go-containerregistry (so Kyverno) does, by exact value. BuildKit's `unknown` attestation
/// manifests are left out. (What must verify is read as containerd reads it: `platforms`.)
fn written_platforms(index: &Value) -> Vec<(&str, &str)> {
    index
        .get("manifests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let part = |key: &str| entry.get("platform")?.get(key)?.as_str();
            let (os, architecture) = (part("os")?, part("architecture")?);
            (os != "unknown" && architecture != "unknown").then_some((os, architecture))
        })
        .collect()
}

/// Kyverno's image data shape (SDK `imagedataloader.ImageDescriptor`): a digest reference
/// (also `repo:tag@digest`) has no tag and is identified by its digest; empty `tag` and a
/// missing `imageIndex` or `config` are left out, as Go's `omitempty` leaves them out.
fn describe(
    image: &str,
    reference: &ivory_reference::ImageReference,
    digest: &str,
    index: Option<Value>,
    manifest: Value,
    config: Value,
) -> Value {
    let tag = match reference.digest() {
        Some(_) => None,
        None => reference.tag(),
    };
    let name = format!("{}/{}", reference.registry(), reference.repository());
    let resolved = match tag {
        Some(t) => format!("{name}:{t}@{digest}"),
        None => format!("{name}@{digest}"),
    };
    let mut out = json!({
        "image": image,
        "resolvedImage": resolved,
        "registry": reference.registry(),
        "repository": reference.repository(),
        "identifier": reference.identifier(),
        "digest": digest,
        "manifest": manifest,
    });
    if let Some(t) = tag {
        out["tag"] = json!(t);
    }
    if let Some(index) = index {
        out["imageIndex"] = index;
    }
    if !config.is_null() {
        out["config"] = config;
    }
    out
}

/// An image config for the CEL `image` context: one whose shape would balloon once parsed is
/// refused as hostile; one that is not JSON is left out, as before any limit applied.
fn image_config(image: &str, registry: &str, bytes: &[u8]) -> Result<Value, VerifyError> {
    match parse_json_bounded(bytes, &JsonLimits::SIGNATURE) {
        // go-containerregistry's ConfigFile always writes these two, even when empty.
        Ok(Value::Object(mut config)) => {
            for key in ["architecture", "os"] {
                config.entry(key).or_insert_with(|| json!(""));
            }
            Ok(Value::Object(config))
        }
        Ok(config) => Ok(config),
        Err(e) if e.is_too_complex() => Err(VerifyError::Hostile {
            image: image.to_owned(),
            registry: registry.to_owned(),
            message: format!("image config refused: it {e}"),
        }),
        Err(_) => Ok(Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(image: &str) -> ivory_reference::ImageReference {
        ivory_reference::ImageReference::parse(image).unwrap()
    }

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    #[test]
    fn shape_follows_kyverno_for_tags_digests_and_indexes() {
        let tagged = describe(
            "nginx:1.27",
            &reference("nginx:1.27"),
            D,
            None,
            json!({"schemaVersion": 2}),
            json!({"architecture": "amd64", "os": "linux"}),
        );
        assert_eq!(
            tagged,
            json!({
                "image": "nginx:1.27",
                "resolvedImage": format!("index.docker.io/library/nginx:1.27@{D}"),
                "registry": "index.docker.io",
                "repository": "library/nginx",
                "identifier": "1.27",
                "tag": "1.27",
                "digest": D,
                "manifest": {"schemaVersion": 2},
                "config": {"architecture": "amd64", "os": "linux"},
            })
        );
        // `repo:tag@digest` is a digest reference for go-containerregistry: the tag is dropped.
        let image = format!("r.test/app:1@{D}");
        let pinned = describe(
            &image,
            &reference(&image),
            D,
            Some(json!({"manifests": []})),
            json!({}),
            Value::Null,
        );
        assert_eq!(pinned["identifier"], D);
        assert_eq!(pinned["resolvedImage"], format!("r.test/app@{D}"));
        assert!(pinned.get("tag").is_none(), "{pinned}");
        assert!(pinned.get("config").is_none(), "{pinned}");
        assert_eq!(pinned["imageIndex"], json!({"manifests": []}));
    }

    #[test]
    fn a_single_platform_index_is_described_by_its_platform_unless_the_pod_pins_another() {
        let index = |platforms: &[(&str, &str)]| {
            let manifests: Vec<Value> = platforms
                .iter()
                .map(
                    |(os, arch)| json!({"digest": D, "platform": {"os": os, "architecture": arch}}),
                )
                .chain([
                    json!({"digest": D, "platform": {"os": "unknown", "architecture": "unknown"}}),
                ])
                .collect();
            json!({ "manifests": manifests })
        };
        let pick = |index: &Value, object: Value| {
            let (os, arch) = described_platform(index, &ImagePlatform::of_workload(Some(&object)));
            format!("{os}/{arch}")
        };
        let free = json!({"spec": {"containers": []}});
        let arm_only = index(&[("linux", "arm64")]);
        assert_eq!(pick(&arm_only, free.clone()), "linux/arm64");
        assert_eq!(
            pick(&index(&[("windows", "amd64")]), free.clone()),
            "windows/amd64"
        );
        // The amd64 manifest of a multi-platform index, as Kyverno (go-containerregistry).
        let both = index(&[("linux", "arm64"), ("linux", "amd64")]);
        assert_eq!(pick(&both, free.clone()), "linux/amd64");
        // A Pod pinned to a platform the index lacks gets an error naming it, not another's data.
        let pinned = json!({"spec": {"nodeSelector": {"kubernetes.io/arch": "s390x"}}});
        assert_eq!(pick(&arm_only, pinned), "linux/s390x");
        let windows_pod = json!({"spec": {"nodeSelector": {"kubernetes.io/os": "windows"}}});
        assert_eq!(pick(&arm_only, windows_pod), "windows/amd64");
    }

    #[test]
    fn image_config_that_would_balloon_is_hostile() {
        let objects = ivory_registry::JsonLimits::SIGNATURE.max_objects + 1;
        let hostile = format!("[{}]", vec![r#"{"secret":0}"#; objects].join(","));
        let err = image_config("r.test/app:1", "r.test", hostile.as_bytes()).unwrap_err();
        assert_eq!(err.kind(), ivory_engine::verifier::ErrorKind::Hostile);
        let text = err.to_string();
        assert!(
            text.contains("r.test/app:1") && text.contains("image config refused"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
        let ok = image_config("r.test/app:1", "r.test", br#"{"os":"linux"}"#).unwrap();
        assert_eq!(ok["os"], "linux");
        assert!(
            image_config("r.test/app:1", "r.test", b"not json")
                .unwrap()
                .is_null()
        );
    }
}

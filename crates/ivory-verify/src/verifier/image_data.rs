//! Image data for the CEL `image` context (`image.GetMetadata`): the manifest (and the index
//! it came from) and the config of an image, by digest.

use ivory_engine::verifier::VerifyError;
use ivory_registry::{Credentials, JsonLimits, parse_json_bounded};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::CosignVerifier;
use crate::classify::map_error;

impl CosignVerifier {
    /// The image data of `image`, fetched by the digest its tag resolves to.
    pub(super) async fn image_data_inner(
        &self,
        image: &str,
        creds: &Credentials,
        deadline: Instant,
    ) -> Result<Value, VerifyError> {
        let reference = self.reference(image)?;
        let digest = self.resolve(image, &reference, creds, deadline).await?;
        let registry = &self.inner.registry;
        let pinned = format!(
            "{}/{}@{digest}",
            reference.registry(),
            reference.repository()
        );
        let top = registry
            .fetch_manifest(&pinned, creds, deadline)
            .await
            .map_err(|e| map_error(image, "fetching the manifest", e, deadline))?;
        let (index, manifest) = if top.is_index() {
            let platform = ivory_registry::Platform {
                os: "linux".into(),
                architecture: "amd64".into(),
                variant: None,
            };
            let m = registry
                .fetch_platform_manifest(&pinned, &platform, creds, deadline)
                .await
                .map_err(|e| map_error(image, "fetching the platform manifest", e, deadline))?;
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
                    .map_err(|e| map_error(image, "fetching the config", e, deadline))?;
                image_config(image, reference.registry(), &bytes)?
            }
            None => Value::Null,
        };
        let tag = reference.tag().map(str::to_owned);
        Ok(json!({
            "image": image,
            "resolvedImage": format!("{}/{}{}@{digest}", reference.registry(), reference.repository(), tag.as_deref().map(|t| format!(":{t}")).unwrap_or_default()),
            "registry": reference.registry(),
            "repository": reference.repository(),
            "identifier": tag.clone().unwrap_or_else(|| digest.clone()),
            "tag": tag.unwrap_or_default(),
            "digest": digest,
            "imageIndex": index,
            "manifest": manifest.json,
            "config": config,
        }))
    }
}

/// An image config for the CEL `image` context: one whose shape would balloon once parsed is
/// refused as hostile; one that is not JSON is left out, as before any limit applied.
fn image_config(image: &str, registry: &str, bytes: &[u8]) -> Result<Value, VerifyError> {
    match parse_json_bounded(bytes, &JsonLimits::SIGNATURE) {
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

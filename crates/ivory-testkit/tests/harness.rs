//! The harness itself: process lifecycle, request log, layout pushing, token auth.

use ivory_testkit::{
    AuthMode, HarnessOptions, OCI_INDEX, OciLayout, RegistryHarness, write_simple_image,
};
use serde_json::json;

#[tokio::test]
async fn nested_layout_is_pushed_children_first_and_only_tagged_entries_get_tags() {
    let h = RegistryHarness::start(HarnessOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut layout = OciLayout::create(dir.path()).unwrap();
    let image = layout.add_image(b"{}", &[b"layer"], None).unwrap();
    let inner = layout
        .add_index(&[(
            image.clone(),
            Some(json!({"os":"linux","architecture":"amd64"})),
        )])
        .unwrap();
    let outer = layout.add_index(&[(inner.clone(), None)]).unwrap();
    let untagged = layout.add_image(b"{\"x\":1}", &[b"other"], None).unwrap();
    layout.add_entry(&outer, Some("nested"));
    layout.add_entry(&untagged, None);
    layout.finish().unwrap();

    let tags = h.push_oci_layout(dir.path(), "nest").await.unwrap();
    assert_eq!(tags.len(), 1);
    assert_eq!(tags["nested"], outer.digest);

    let puts: Vec<String> = h
        .requests()
        .into_iter()
        .filter(|(m, p, _)| m == "PUT" && p.contains("/manifests/"))
        .map(|(_, p, s)| {
            assert_eq!(s, 201, "{p}");
            p.rsplit('/').next().unwrap().to_string()
        })
        .collect();
    let pos = |d: &str| puts.iter().position(|p| p == d).unwrap();
    assert!(pos(&image.digest) < pos(&inner.digest));
    assert!(pos(&inner.digest) < pos(&outer.digest));
    assert!(puts.contains(&untagged.digest));
    assert_eq!(puts.last().map(String::as_str), Some("nested"));

    // The registry serves what was pushed, by tag, with the index media type.
    let res = h
        .http_client()
        .unwrap()
        .get(format!("{}/v2/nest/manifests/nested", h.base_url()))
        .header("Accept", OCI_INDEX)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["Docker-Content-Digest"].to_str().unwrap(),
        outer.digest
    );
}

#[tokio::test]
async fn requests_reset_and_drop_cleans_up() {
    let h = RegistryHarness::start(HarnessOptions::default())
        .await
        .unwrap();
    let client = h.http_client().unwrap();
    client
        .get(format!("{}/v2/none/manifests/x", h.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        h.requests(),
        vec![("GET".to_string(), "/v2/none/manifests/x".to_string(), 404)]
    );
    h.reset_requests();
    assert!(h.requests().is_empty());

    let dir = h.dir().unwrap().to_path_buf();
    let host = h.host().to_string();
    drop(h);
    assert!(!dir.exists(), "temp dir removed");
    assert!(
        std::net::TcpStream::connect(&host).is_err(),
        "registry process stopped"
    );
}

#[tokio::test]
async fn token_mode_rejects_anonymous_pushes_but_accepts_harness_pushes() {
    let h = RegistryHarness::start(HarnessOptions::token(Some(("u", "p"))))
        .await
        .unwrap();
    assert_eq!(
        h.auth(),
        &AuthMode::Token {
            login: Some(("u".into(), "p".into()))
        }
    );
    let dir = tempfile::tempdir().unwrap();
    let img = write_simple_image(dir.path(), "v1", "token").unwrap();
    let tags = h.push_oci_layout(dir.path(), "app").await.unwrap();
    assert_eq!(tags["v1"], img.manifest.digest);

    let res = h
        .http_client()
        .unwrap()
        .get(format!("{}/v2/app/manifests/v1", h.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let challenge = res.headers()["WWW-Authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Bearer realm="), "{challenge}");
}

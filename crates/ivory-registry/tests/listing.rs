//! Tag and catalog listings across pages.

use ivory_registry::{Config, Credentials};
use ivory_testkit::{AuthMode, OCI_MANIFEST};

use crate::util::{client_with, ok_deadline, push_simple, start};

#[tokio::test]
async fn tags_and_catalog_are_paginated() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "paged", "t00", "paged").await;
    // Re-tag the same manifest: only the tag list grows.
    let manifest = {
        let r = client_with(&h, Config::default());
        r.fetch_manifest(
            &format!("{}/paged@{}", h.host(), img.manifest.digest),
            &Credentials::anonymous(),
            ok_deadline(),
        )
        .await
        .unwrap()
        .bytes
    };
    for i in 1..8 {
        h.push_manifest("paged", &format!("t{i:02}"), OCI_MANIFEST, &manifest)
            .await
            .unwrap();
    }
    for repo in ["r/a", "r/b", "r/c", "r/d"] {
        push_simple(&h, repo, "v1", repo).await;
    }

    let r = client_with(
        &h,
        Config {
            page_size: 3,
            ..Config::default()
        },
    );
    let creds = Credentials::anonymous();
    h.reset_requests();
    let tags = r
        .list_tags(&format!("{}/paged", h.host()), &creds, ok_deadline())
        .await
        .unwrap();
    let want: Vec<String> = (0..8).map(|i| format!("t{i:02}")).collect();
    assert_eq!(tags, want);
    let pages = h
        .requests()
        .into_iter()
        .filter(|(_, p, _)| p.contains("/tags/list"))
        .count();
    // Distribution 2.8 ignores `n` on tags/list: one over-full page ends the listing.
    assert_eq!(pages, 1, "{:?}", h.requests());

    h.reset_requests();
    let repos = r.catalog(h.host(), &creds, ok_deadline()).await.unwrap();
    assert_eq!(repos, vec!["paged", "r/a", "r/b", "r/c", "r/d"]);
    let pages: Vec<String> = h
        .requests()
        .into_iter()
        .filter(|(_, p, _)| p.starts_with("/v2/_catalog"))
        .map(|(_, p, _)| p)
        .collect();
    // 5 repositories at 3 per page: a full page, then a short one.
    assert_eq!(
        pages,
        vec![
            "/v2/_catalog?n=3".to_string(),
            "/v2/_catalog?n=3&last=r%2Fb".to_string()
        ]
    );
}

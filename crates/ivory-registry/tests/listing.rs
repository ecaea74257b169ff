//! Tag and catalog listings across pages.

use ivory_registry::{Config, Credentials};
use ivory_testkit::{AuthMode, OCI_MANIFEST};

use crate::util::reference;
use crate::util::{client_with, ok_deadline, push_simple, start};

#[tokio::test]
async fn tags_and_catalog_are_paginated() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "paged", "t00", "paged").await;
    // Re-tag the same manifest: only the tag list grows.
    let manifest = {
        let r = client_with(&h, Config::default());
        r.fetch_manifest(
            &reference(&format!("{}/paged@{}", h.host(), img.manifest.digest)),
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
    // Distribution 2.8 ignores `n` and `last` on tags/list: each over-full page is cut to
    // the 3 smallest tags after `last`, so 8 tags take 3 pages (the last one not cut).
    assert_eq!(pages, 3, "{:?}", h.requests());

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

/// A hostile registry's listings, page by page: names outside the grammar are counted and
/// never returned, each page keeps at most `n` names, all after the previous page's, and a
/// `Link` to another origin is no next page.
#[tokio::test]
async fn hostile_listings_are_validated_cut_and_stay_on_the_origin() {
    use ivory_testkit::{
        HOSTILE_REPOSITORIES, HOSTILE_TAGS, HostileOptions, HostileServer, pages_tag,
    };
    let h = HostileServer::start(HostileOptions::default())
        .await
        .unwrap();
    let r = ivory_registry::Registry::new(Config {
        page_size: 40,
        ..Config::default()
    })
    .unwrap();
    let creds = Credentials::anonymous().allow_insecure(true);

    let mut catalog = r.catalog_pages(&h.host(), &creds).unwrap();
    let page = catalog.next_page(ok_deadline()).await.unwrap().unwrap();
    assert_eq!(page.names, ["ctrl", "good", "pages"]);
    assert_eq!(page.invalid, HOSTILE_REPOSITORIES.len() - 3);
    // Its only Link names another origin: the listing ends there.
    assert!(catalog.next_page(ok_deadline()).await.unwrap().is_none());
    let catalog_requests = h
        .requests()
        .iter()
        .filter(|q| q.path == "/v2/_catalog")
        .count();
    assert_eq!(catalog_requests, 1);

    let mut ctrl = r.tag_pages(&format!("{}/ctrl", h.host()), &creds).unwrap();
    let page = ctrl.next_page(ok_deadline()).await.unwrap().unwrap();
    assert_eq!(page.names, ["v1"]);
    assert_eq!(page.invalid, HOSTILE_TAGS.len());

    // Endless pages of 40 entries: 4 valid tags and 36 long names outside the grammar each.
    let mut pages = r.tag_pages(&format!("{}/pages", h.host()), &creds).unwrap();
    let mut previous: Option<String> = None;
    for p in 0..5u64 {
        let page = pages.next_page(ok_deadline()).await.unwrap().unwrap();
        let want: Vec<String> = (0..4).map(|i| pages_tag(p, i)).collect();
        assert_eq!(page.names, want);
        assert_eq!((page.invalid, page.entries, page.cut), (36, 40, 0));
        assert!(previous.as_deref() < page.names.first().map(String::as_str));
        previous = page.names.last().cloned();
    }
    // It never ends on its own: the page cap ends it with an error.
    let capped = ivory_registry::Registry::new(Config {
        page_size: 40,
        max_pages: 3,
        ..Config::default()
    })
    .unwrap();
    let err = capped
        .list_tags(&format!("{}/pages", h.host()), &creds, ok_deadline())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("did not end after 3 pages"),
        "{err}"
    );
}

//! The egress rule through real connections. Every test that could reach the metadata address
//! runs in a private network namespace ([`in_metadata_netns`]) where 169.254.169.254 and
//! fd00:ec2::254 are a local stand-in that counts connections, and real `getaddrinfo` answers
//! come from the namespace's hosts file (`metadata.ivory.test` → 169.254.169.254,
//! `metadata6.ivory.test` → fd00:ec2::254, `nat64.ivory.test` → 64:ff9b::a9fe:a9fe).

use ivory_registry::{
    AddressClass, Cidr, Config, Credentials, EgressRule, EgressVia, Error, PrivateNetworks,
    Registry, UrlFetchError,
};
use ivory_testkit::{
    AuthMode, HostileAuth, HostileOptions, HostileServer, MetadataListener, in_metadata_netns,
};

use crate::util::{client_with, ok_deadline, push_simple, reference, seq, start};

/// Runs the calling test in the namespace; false outside it (the namespace run has passed).
fn in_netns(test: &str) -> bool {
    in_metadata_netns(&format!("egress::{test}"))
}

/// Credentials for `registry` that would travel if ivory followed it: Basic, plain HTTP
/// allowed.
fn login(registry: &str) -> Credentials {
    Credentials::anonymous()
        .with_basic(registry, "user", "hunter2")
        .allow_insecure(true)
}

/// `err` is the egress rule's refusal of `via`, naming `image`, an address the default rule
/// always refuses, and the flag that would allow it.
fn assert_refused(err: &Error, via: EgressVia, image: &str) {
    let text = err.to_string();
    match err {
        Error::EgressRefused {
            via: got,
            image: named,
            refusal,
            ..
        } => {
            assert_eq!((*got, named.as_str()), (via, image), "{text}");
            assert!(refusal.class.always_refused(), "{text}");
        }
        other => panic!("{image}: not an egress refusal: {other}"),
    }
    assert!(
        text.contains(image) && text.contains("--egress-allow "),
        "{text}"
    );
    assert!(!err.is_transient(), "{text}");
}

/// The registry host spelt every way the URL parser or the system resolver reads as the
/// metadata address.
const METADATA_HOSTS: [&str; 17] = [
    "169.254.169.254",
    "169.254.169.254.",
    "%31%36%39.254.169.254",
    "2852039166",
    "0xa9fea9fe",
    "169.254.43518",
    "0251.0376.0251.0376",
    "0xA9.0xfe.43518",
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:a9fe]",
    "[::169.254.169.254]",
    "[64:ff9b::a9fe:a9fe]",
    "[fd00:ec2::254]",
    "[fe80::1]",
    "metadata.ivory.test",
    "metadata6.ivory.test",
    "nat64.ivory.test",
];

#[tokio::test]
async fn every_spelling_of_the_metadata_address_is_refused_before_connecting() {
    if !in_netns("every_spelling_of_the_metadata_address_is_refused_before_connecting") {
        return;
    }
    let metadata = MetadataListener::bind();
    let r = Registry::new(Config::default()).unwrap();
    for host in METADATA_HOSTS {
        for image in [
            format!("{host}:80/latest/meta-data:1"),
            format!("{host}/latest/meta-data:1"),
        ] {
            // Without a dot or a port, a first part is a Docker Hub namespace, not a host.
            let parsed = reference(&image);
            if parsed.registry() == ivory_reference::DEFAULT_REGISTRY {
                continue;
            }
            let creds = login(parsed.registry());
            let err = r
                .fetch_manifest(&parsed, &creds, ok_deadline())
                .await
                .unwrap_err();
            assert_refused(&err, EgressVia::Registry, &image);
            let err = r
                .resolve_digest(&parsed, &creds, ok_deadline())
                .await
                .unwrap_err();
            assert_refused(&err, EgressVia::Registry, &image);
        }
    }
    assert_eq!(
        metadata.connections(),
        0,
        "a connection reached the metadata stand-in"
    );
}

#[tokio::test]
async fn redirects_to_the_metadata_address_are_refused_even_through_an_allowed_host() {
    if !in_netns("redirects_to_the_metadata_address_are_refused_even_through_an_allowed_host") {
        return;
    }
    let metadata = MetadataListener::bind();
    let r = Registry::new(Config::default()).unwrap();
    for target in [
        "169.254.169.254",
        "2852039166",
        "0xa9fea9fe",
        "169.254.169.254.",
        "%31%36%39.254.169.254",
        "[::ffff:169.254.169.254]",
        "[64:ff9b::a9fe:a9fe]",
        "metadata.ivory.test",
        "nat64.ivory.test",
    ] {
        let last = HostileServer::start(HostileOptions {
            redirect_to: Some(target.into()),
            ..HostileOptions::default()
        })
        .await
        .unwrap();
        // One hop, then two: an allowed loopback registry redirecting to the one above.
        let first = HostileServer::start(HostileOptions {
            redirect_to: Some(last.host()),
            ..HostileOptions::default()
        })
        .await
        .unwrap();
        for image in [
            format!("{}/redirect:latest", last.host()),
            format!("{}/redirect:latest", first.host()),
        ] {
            let creds = login(reference(&image).registry());
            let err = r
                .fetch_manifest(&reference(&image), &creds, ok_deadline())
                .await
                .unwrap_err();
            assert_refused(&err, EgressVia::Redirect, &image);
        }
        assert!(
            last.requests().iter().any(|q| q.path.contains("redirect")),
            "the chain went through the allowed host"
        );
    }
    assert_eq!(
        metadata.connections(),
        0,
        "a redirect reached the metadata stand-in"
    );
}

#[tokio::test]
async fn token_realms_at_the_metadata_address_are_refused() {
    if !in_netns("token_realms_at_the_metadata_address_are_refused") {
        return;
    }
    let metadata = MetadataListener::bind();
    let r = Registry::new(Config::default()).unwrap();
    // A realm that redirects there: an allowed host whose answer is a redirect.
    let bouncer = HostileServer::start(HostileOptions {
        redirect_to: Some("2852039166".into()),
        ..HostileOptions::default()
    })
    .await
    .unwrap();
    for realm in [
        "http://169.254.169.254/latest/api/token".to_owned(),
        "http://2852039166/token".to_owned(),
        "http://0xa9fea9fe/token".to_owned(),
        "http://169.254.43518/token".to_owned(),
        "http://[::ffff:169.254.169.254]/token".to_owned(),
        "http://[fd00:ec2::254]/token".to_owned(),
        "http://metadata.ivory.test/token".to_owned(),
        "http://nat64.ivory.test/token".to_owned(),
        format!("http://{}/v2/redirect/manifests/latest", bouncer.host()),
    ] {
        let h = HostileServer::start(HostileOptions {
            auth: HostileAuth::Realm(realm.clone()),
            ..HostileOptions::default()
        })
        .await
        .unwrap();
        let image = format!("{}/good:latest", h.host());
        let err = r
            .fetch_manifest(&reference(&image), &login(&h.host()), ok_deadline())
            .await
            .unwrap_err();
        assert_refused(&err, EgressVia::TokenRealm, &image);
    }
    assert_eq!(
        metadata.connections(),
        0,
        "a token realm reached the metadata stand-in"
    );
}

#[tokio::test]
async fn urls_from_certificates_are_judged_by_the_same_rule() {
    if !in_netns("urls_from_certificates_are_judged_by_the_same_rule") {
        return;
    }
    let metadata = MetadataListener::bind();
    let fetcher = Registry::new(Config::default())
        .unwrap()
        .url_fetcher(1 << 20)
        .unwrap();
    for url in [
        "http://2852039166/a.crl",
        "http://0251.0376.0251.0376/a.crl",
        "http://[::169.254.169.254]/a.crl",
        "http://[64:ff9b::a9fe:a9fe]/a.crl",
        "http://metadata.ivory.test/a.crl",
        "http://metadata6.ivory.test/a.crl",
        "http://nat64.ivory.test/a.crl",
    ] {
        let err = fetcher.get(url, 1 << 20, ok_deadline()).await.unwrap_err();
        assert!(
            matches!(&err, UrlFetchError::AddressRefused(r) if r.class.always_refused()),
            "{url}: {err}"
        );
    }
    assert_eq!(
        metadata.connections(),
        0,
        "a CRL fetch reached the metadata stand-in"
    );
}

#[tokio::test]
async fn private_addresses_follow_the_setting_and_the_allow_list() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "team/app", "v1", "egress").await;
    let image = format!("{}/team/app:v1", h.host());
    h.reset_requests();
    let deny = EgressRule {
        allow: Vec::new(),
        private: PrivateNetworks::Deny,
    };
    let r = client_with(
        &h,
        Config {
            egress: deny.clone(),
            ..Config::default()
        },
    );
    let err = r
        .resolve_digest(&reference(&image), &Credentials::anonymous(), ok_deadline())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, Error::EgressRefused { via: EgressVia::Registry, refusal, .. }
            if refusal.class == AddressClass::Loopback),
        "{text}"
    );
    assert!(
        text.contains(&image) && text.contains("--egress-private=allow"),
        "{text}"
    );
    assert!(seq(&h).is_empty(), "the registry saw {:?}", seq(&h));
    // `localhost` resolves to loopback: refused on the resolver's answer, as the literal is.
    let by_name = image.replacen("127.0.0.1", "localhost", 1);
    let err = r
        .resolve_digest(
            &reference(&by_name),
            &Credentials::anonymous(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::EgressRefused {
                via: EgressVia::Registry,
                ..
            }
        ),
        "{err}"
    );
    assert!(seq(&h).is_empty(), "the registry saw {:?}", seq(&h));

    let allowed = client_with(
        &h,
        Config {
            egress: EgressRule {
                allow: vec!["127.0.0.1/32".parse::<Cidr>().unwrap()],
                ..deny
            },
            ..Config::default()
        },
    );
    let digest = allowed
        .resolve_digest(&reference(&image), &Credentials::anonymous(), ok_deadline())
        .await
        .unwrap();
    assert_eq!(digest, img.manifest.digest);
}

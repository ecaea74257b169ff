//! `ivory verify` as a process against the real registry with the cosign-signed fixtures.

use ivory_testkit::refused_host;
use serde_json::Value;

use crate::cli_util::{
    ivory, key, policy_args, push_fixture, registry_and_ca, write, write_require_signed,
};
use crate::util::{VERIFY_SIGNED, key_attestor, policy};

fn image<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == name)
        .unwrap_or_else(|| panic!("{name} not in {doc:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_key_flags_signed_unsigned_and_wrong_key() {
    let (h, _dir, ca) = registry_and_ca().await;
    let (signed, signed_digest) = push_fixture(&h, "sig-p256").await;
    let (unsigned, unsigned_digest) = push_fixture(&h, "unsigned").await;
    let (wrong, _) = push_fixture(&h, "sig-wrong-key").await;
    let base = |images: &[&str], output: &str| {
        let mut args = vec![
            "verify".to_owned(),
            "--key".into(),
            key("cosign-p256.pub").display().to_string(),
            "--insecure-ignore-tlog".into(),
            "--registry-ca".into(),
            ca.display().to_string(),
            "-o".into(),
            output.into(),
        ];
        args.extend(images.iter().map(|i| i.to_string()));
        args
    };

    let run = ivory(base(&[&signed], "json")).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    assert_eq!(doc["summary"]["pass"], 1);
    let img = image(&doc, &signed);
    assert_eq!(img["digest"], signed_digest);
    assert_eq!(img["verdict"], "pass");
    let policy = &img["policies"][0];
    assert_eq!(policy["policy"], "ivory-cli-flags");
    assert_eq!(policy["result"], "pass");
    assert_eq!(policy["attestors"][0]["attestor"], "key");
    assert_eq!(policy["attestors"][0]["result"], "verified");

    let run = ivory(base(&[&signed, &unsigned, &wrong], "json")).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    assert_eq!(doc["summary"]["images"], 3);
    assert_eq!(doc["summary"]["pass"], 1);
    assert_eq!(doc["summary"]["fail"], 2);
    let img = image(&doc, &unsigned);
    assert_eq!(img["verdict"], "fail");
    assert_eq!(img["digest"], unsigned_digest);
    let attestor = &img["policies"][0]["attestors"][0];
    assert_eq!(attestor["result"], "failed");
    assert!(
        attestor["reason"]
            .as_str()
            .unwrap()
            .contains("signatures not found"),
        "{attestor}"
    );
    assert!(
        img["message"]
            .as_str()
            .unwrap()
            .contains("policy ivory-cli-flags"),
        "{img}"
    );
    let img = image(&doc, &wrong);
    assert_eq!(img["verdict"], "fail");
    let reason = img["policies"][0]["attestors"][0]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("no matching signatures"), "{reason}");

    // The table names each image, its verdict and the attestor outcome.
    let run = ivory(base(&[&signed, &unsigned], "table")).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stdout
            .contains(&format!("PASS   {signed}  {signed_digest}")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!("FAIL   {unsigned}")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("attestor key (signature) verified"));
    assert!(run.stdout.contains("2 images: 1 pass, 1 fail, 0 error"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_files_registry_errors_and_usage() {
    let (h, dir, ca) = registry_and_ca().await;
    let (signed, signed_digest) = push_fixture(&h, "sig-p256").await;
    let (unsigned, _) = push_fixture(&h, "unsigned").await;
    // verifyDigest and mutateDigest stay at their defaults (true): tags are verified by digest.
    let file = write_require_signed(dir.path(), "signed.yaml", &h);
    let verify = |images: Vec<String>| {
        let mut args = policy_args("verify", &file, &ca);
        args.extend(["-o".into(), "json".into()]);
        args.extend(images);
        ivory(args)
    };

    let run = verify(vec![signed.clone(), unsigned.clone()]).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    let img = image(&doc, &signed);
    assert_eq!(img["verdict"], "pass", "{img}");
    assert_eq!(img["digest"], signed_digest);
    let img = image(&doc, &unsigned);
    assert_eq!(img["verdict"], "fail");
    assert_eq!(img["policies"][0]["policy"], "require-signed");
    assert_eq!(
        img["policies"][0]["message"],
        "failed the image Signature verification"
    );

    // A digest reference verifies without resolving.
    let by_digest = format!("{}@{signed_digest}", signed.trim_end_matches(":v1"));
    let run = verify(vec![by_digest.clone()]).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(image(&run.json(), &by_digest)["verdict"], "pass");

    // An unreachable registry is an error naming the image and the registry.
    let other = format!("{}/elsewhere/app:v1", refused_host().unwrap());
    let run = verify(vec![signed.clone(), other.clone()]).await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    let img = image(&doc, &other);
    assert_eq!(img["verdict"], "error");
    let message = img["message"].as_str().unwrap();
    let registry = other.split('/').next().unwrap();
    assert!(message.contains(&other), "{message}");
    assert!(message.contains(registry), "{message}");

    // Usage and configuration errors exit 2 with a message.
    let run = ivory(["verify", &signed]).await;
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--policy"), "{}", run.stderr);
    let run = ivory(["verify", "--policy", "/nonexistent/p.yaml", &signed]).await;
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("/nonexistent/p.yaml"), "{}", run.stderr);
    let run = ivory(["verify", "--certificate-identity", "me", &signed]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_keyless_flags_with_a_trusted_root() {
    let (h, _dir, ca) = registry_and_ca().await;
    let (keyless, digest) = push_fixture(&h, "keyless-cosign2").await;
    let root = ivory_testkit::fixtures_dir().join("keyless/trusted_root.json");
    let issuer = "https://token.actions.githubusercontent.com";
    let subject = "https://github.com/ivory-test/app/.github/workflows/release.yml@refs/heads/main";
    let verify = |subject: &str| {
        ivory(vec![
            "verify".to_owned(),
            "--certificate-identity".into(),
            subject.into(),
            "--certificate-oidc-issuer".into(),
            issuer.into(),
            "--trusted-root".into(),
            root.display().to_string(),
            "--registry-ca".into(),
            ca.display().to_string(),
            "-o".into(),
            "json".into(),
            keyless.clone(),
        ])
    };
    let run = verify(subject).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    let img = image(&doc, &keyless);
    assert_eq!(img["digest"], digest);
    assert_eq!(img["policies"][0]["attestors"][0]["attestor"], "keyless");
    assert_eq!(img["policies"][0]["attestors"][0]["result"], "verified");

    let run =
        verify("https://github.com/someone-else/app/.github/workflows/x.yml@refs/heads/main").await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    let attestor = &image(&doc, &keyless)["policies"][0]["attestors"][0];
    assert_eq!(attestor["result"], "failed", "{attestor}");
}

/// Image text reaches the table escaped: one line per record, no control character (ESC,
/// CR/LF, C1, bidi) left for the terminal to act on.
#[tokio::test]
async fn the_table_escapes_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let host = refused_host().unwrap();
    let file = write(
        dir.path(),
        "signed.yaml",
        &policy(
            "require-signed",
            &format!("{host}/*"),
            &format!("{}{VERIFY_SIGNED}", key_attestor()),
        ),
    );
    let forged = format!("{host}/a\x1b[2K\r\nPASS   {host}/b:v1\u{9b}31m\u{202e}:v1");
    let run = ivory([
        "verify".to_owned(),
        "--policy".into(),
        file.display().to_string(),
        forged,
    ])
    .await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.stdout.lines().count(), 2, "{}", run.stdout);
    assert!(
        run.stdout.contains("a\\x1b[2K\\x0d\\x0aPASS   ")
            && run.stdout.contains("\\u{9b}31m\\u{202e}:v1"),
        "{}",
        run.stdout
    );
    for text in [&run.stdout, &run.stderr] {
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{text:?}"
        );
    }
}

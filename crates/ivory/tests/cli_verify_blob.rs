//! `ivory verify-blob` as a process: blob bundles made by real cosign v3 (`fixtures/blob`, with
//! what `cosign verify-blob` answered for each), the public-good conformance bundles, and the
//! official Sigstore conformance suite's every verification case through
//! `scripts/sigstore-conformance-client` (`scripts/sigstore-conformance.sh`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::util::BIN;
use ivory_testkit::fixtures_dir;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn verify_blob(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("verify-blob")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every verification case of the suite (70 folders, each as a file and as a digest) passes: the
/// count of passes decides, since a client refusing everything passes the 98 `_fail` runs.
#[test]
fn sigstore_conformance_suite_passes_all_140_verification_cases() {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/sigstore-conformance.sh"))
        .arg(BIN)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let closing = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("sigstore-conformance: "))
        .unwrap_or_else(|| panic!("no closing line:\n{}", text(&out)));
    assert_eq!(closing, "140 passed, 0 failed", "{stdout}");
    assert!(out.status.success(), "{}", text(&out));
}

/// cosign v3's `verify-blob` answers recorded by the generator, replayed with `ivory verify-blob`:
/// the TSA-stamped bundle verifies (with the trusted root naming the TSA, and without the log as
/// cosign asks), so does the bundle with neither log entry nor timestamp under
/// `--insecure-ignore-tlog`; a tampered blob, another key or a missing log entry are refused, as
/// by cosign.
#[test]
fn cosign_v3_blob_bundles_verify_as_cosign_says() {
    let dir = fixtures_dir().join("blob");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut tampered = std::fs::read(dir.join("artifact.txt")).unwrap();
    tampered.extend_from_slice(b"tampered\n");
    std::fs::write(work.path().join("tampered.txt"), tampered).unwrap();
    let cases = manifest["cosignVerifyBlob"].as_object().unwrap();
    for (name, case) in cases {
        let args: Vec<String> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let a = a.as_str().unwrap();
                match a {
                    "tampered.txt" => work.path().join(a).display().to_string(),
                    _ if a.starts_with("--") => a.to_owned(),
                    _ => dir.join(a).display().to_string(),
                }
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = verify_blob(&dir, &args);
        let cosign_verified = case["verified"].as_bool().unwrap();
        assert_eq!(
            out.status.code(),
            Some(if cosign_verified { 0 } else { 1 }),
            "{name}: {}",
            text(&out)
        );
    }
    assert_eq!(cases.len(), 6, "{manifest:#}");
    // Without the flag the bare bundle is refused, as by cosign.
    let plain = |extra: &[&str], blob: &str| {
        let mut args = vec![
            "--key",
            "key.pub",
            "--bundle",
            "plain/artifact.txt.sigstore.json",
        ];
        args.extend_from_slice(extra);
        args.push(blob);
        verify_blob(&dir, &args)
    };
    let out = plain(&[], "artifact.txt");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = plain(&["--insecure-ignore-tlog", "-o", "json"], "artifact.txt");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["verified"], true, "{doc:#}");
    assert!(
        doc["signer"]["key"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"),
        "{doc:#}"
    );
}

/// A public-good bundle (Rekor v1, the embedded trusted root): the file and its digest verify,
/// `-o json` says who signed and how; a wrong identity or issuer is refused (exit 1, reason
/// named); a missing file, a bad flag combination or an unusable trusted root are exit 2.
#[test]
fn identity_digest_json_and_exit_codes() {
    let case = fixtures_dir().join("sigstore-conformance/test/assets/bundle-verify");
    let identity = "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main";
    let issuer = "https://token.actions.githubusercontent.com";
    let bundle = "happy-path-v0.3/bundle.sigstore.json";
    let digest = "sha256:a0cfc71271d6e278e57cd332ff957c3f7043fdda354c4cbb190a30d56efa01bf";
    let run = |extra: &[&str], blob: &str| {
        let mut args = vec!["--bundle", bundle];
        args.extend_from_slice(extra);
        args.push(blob);
        verify_blob(&case, &args)
    };
    let exact = [
        "--certificate-identity",
        identity,
        "--certificate-oidc-issuer",
        issuer,
    ];
    for blob in ["a.txt", digest] {
        let out = run(&exact, blob);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(text(&out).starts_with("Verified OK"), "{}", text(&out));
    }
    let out = run(&[&exact[..], &["-o", "json"]].concat(), digest);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["verified"], true, "{doc:#}");
    assert_eq!(doc["signer"]["subject"], identity, "{doc:#}");
    assert_eq!(doc["signer"]["issuer"], issuer, "{doc:#}");
    assert!(doc["signer"]["logIndex"].is_u64(), "{doc:#}");

    let regexps = [
        "--certificate-identity-regexp",
        "^https://github.com/sigstore-conformance/",
        "--certificate-oidc-issuer-regexp",
        "githubusercontent",
    ];
    let out = run(&regexps, "a.txt");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for wrong in [
        [
            "--certificate-identity",
            "https://github.com/other/repo",
            "--certificate-oidc-issuer",
            issuer,
        ],
        [
            "--certificate-identity",
            identity,
            "--certificate-oidc-issuer",
            "https://accounts.google.com",
        ],
    ] {
        let out = run(&[&wrong[..], &["-o", "json"]].concat(), "a.txt");
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["verified"], false, "{doc:#}");
        assert!(
            doc["message"]
                .as_str()
                .unwrap()
                .contains("none of the expected identities"),
            "{doc:#}"
        );
    }
    // Another artifact: its digest names no file, so it is a digest, and does not verify.
    let other = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    assert_eq!(run(&exact, other).status.code(), Some(1));

    let missing = run(&exact, "no-such-file.txt");
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    let folder = run(&exact, "happy-path-v0.3");
    assert_eq!(folder.status.code(), Some(2), "{}", text(&folder));
    let no_issuer = run(&["--certificate-identity", identity], "a.txt");
    assert_eq!(no_issuer.status.code(), Some(2), "{}", text(&no_issuer));
    let bad_root = run(
        &[&exact[..], &["--trusted-root", "a.txt"]].concat(),
        "a.txt",
    );
    assert_eq!(bad_root.status.code(), Some(2), "{}", text(&bad_root));
    let neither = verify_blob(&case, &["--bundle", bundle, "a.txt"]);
    assert_eq!(neither.status.code(), Some(2), "{}", text(&neither));
}

/// The conformance client speaks only the verification half of the protocol: signing is refused,
/// and `--staging` (whose trusted root ivory does not embed) only with `--trusted-root`.
#[test]
fn conformance_client_refuses_signing_and_staging_without_a_root() {
    let case = fixtures_dir().join("sigstore-conformance/test/assets/bundle-verify");
    let client = |args: &[&str]| {
        Command::new(repo_root().join("scripts/sigstore-conformance-client"))
            .args(args)
            .env("IVORY_BIN", BIN)
            .current_dir(&case)
            .output()
            .unwrap()
    };
    let keyless = [
        "--bundle",
        "happy-path-v0.3/bundle.sigstore.json",
        "--certificate-identity",
        "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main",
        "--certificate-oidc-issuer",
        "https://token.actions.githubusercontent.com",
    ];
    let out = client(&[&["verify-bundle"][..], &keyless, &["a.txt"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = client(&[
        "sign-bundle",
        "--identity-token",
        "t",
        "--bundle",
        "b.json",
        "a.txt",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = client(&[&["verify-bundle", "--staging"][..], &keyless, &["a.txt"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--staging needs --trusted-root"),
        "{}",
        text(&out)
    );
    let out = client(
        &[
            &["verify-bundle", "--unknown", "x"][..],
            &keyless,
            &["a.txt"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

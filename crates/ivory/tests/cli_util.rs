//! Helpers for the one-shot commands (`verify`, `apply`, `audit`) run as processes.

use std::path::{Path, PathBuf};

use ivory_testkit::Harness;
use serde_json::Value;

use crate::util::BIN;
use ivory_testkit::fixtures_dir;

/// Exit code, stdout and stderr of one `ivory` run.
pub(crate) struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// stdout parsed as JSON (panics with both streams when it is not).
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs `ivory <args>` to completion, with a persistent cache of its own (empty: every run
/// starts cold unless `args` names a `--cache-dir`, which wins over the environment).
pub(crate) async fn ivory<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let cache = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("IVORY_LOG", "warn")
        .env("IVORY_CACHE_DIR", cache.path())
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `ivory <args>` with `input` on stdin (and an empty cache of its own, as [`ivory`]).
pub(crate) async fn ivory_stdin(args: &[&str], input: &str) -> Run {
    use tokio::io::AsyncWriteExt as _;
    let cache = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .args(args)
        .env("IVORY_LOG", "warn")
        .env("IVORY_CACHE_DIR", cache.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A `policies` folder in `dir` holding `check-images`: every image of `h` must carry a
/// signature by the fixture key (Deny).
pub(crate) fn check_images_policies(dir: &Path, h: &Harness) -> PathBuf {
    let policies = crate::util::policies_dir(dir);
    let body = format!(
        "  validationActions: [Deny]\n{}{}",
        crate::util::key_attestor(),
        crate::util::VERIFY_SIGNED
    );
    write(
        &policies,
        "check-images.yaml",
        &crate::util::policy("check-images", &format!("{}/*", h.host()), &body),
    );
    policies
}

/// Writes `require-signed` to `dir/<file>`: every image of `h` must carry a signature by the
/// fixture key; verifyDigest and mutateDigest at their defaults (true).
pub(crate) fn write_require_signed(dir: &Path, file: &str, h: &Harness) -> PathBuf {
    let body = format!(
        "{}{}",
        crate::util::key_attestor(),
        crate::util::VERIFY_SIGNED
    );
    let glob = format!("{}/*", h.host());
    write(
        dir,
        file,
        &crate::util::policy("require-signed", &glob, &body),
    )
}

/// A harness registry (TLS, no auth) and a temporary folder holding its CA: (registry, folder,
/// the CA file).
pub(crate) async fn registry_and_ca() -> (Harness, tempfile::TempDir, PathBuf) {
    let h = ivory_testkit::RegistryHarness::start_default()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = write_ca(dir.path(), &h);
    (h, dir, ca)
}

/// `ivory <command> --policy <policy> --registry-ca <ca>`'s arguments, to add images and
/// options to.
pub(crate) fn policy_args(command: &str, policy: &Path, ca: &Path) -> Vec<String> {
    vec![
        command.to_owned(),
        "--policy".into(),
        policy.display().to_string(),
        "--registry-ca".into(),
        ca.display().to_string(),
    ]
}

/// Pushes fixture layout `layout` as `ivory/<layout>`; returns (`host/ivory/<layout>:v1`, digest).
pub(crate) async fn push_fixture(h: &Harness, layout: &str) -> (String, String) {
    h.push_fixture(layout).await.unwrap()
}

/// Tags the manifest `digest` of fixture `layout` (already pushed to `repo`) as `tag` too.
pub(crate) async fn retag_fixture(h: &Harness, layout: &str, repo: &str, digest: &str, tag: &str) {
    retag_layout(
        h,
        &fixtures_dir().join("oci/ivory").join(layout),
        repo,
        digest,
        tag,
    )
    .await;
}

/// Tags the manifest `digest` of the OCI layout `dir` (already pushed to `repo`) as `tag` too.
pub(crate) async fn retag_layout(h: &Harness, dir: &Path, repo: &str, digest: &str, tag: &str) {
    let hex = digest.trim_start_matches("sha256:");
    let bytes = std::fs::read(dir.join("blobs/sha256").join(hex)).unwrap();
    let manifest: Value = serde_json::from_slice(&bytes).unwrap();
    let media_type = manifest["mediaType"]
        .as_str()
        .unwrap_or("application/vnd.oci.image.manifest.v1+json");
    h.push_manifest(repo, tag, media_type, &bytes)
        .await
        .unwrap();
}

/// Writes the harness CA and returns its path.
pub(crate) fn write_ca(dir: &Path, h: &Harness) -> PathBuf {
    let path = dir.join("registry-ca.pem");
    std::fs::write(&path, h.ca_pem()).unwrap();
    path
}

/// Writes `text` to `dir/name` and returns the path.
pub(crate) fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Path of a fixture key.
pub(crate) fn key(name: &str) -> PathBuf {
    fixtures_dir().join("keys").join(name)
}

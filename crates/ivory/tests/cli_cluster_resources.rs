//! `--cluster-resources` on `ivory verify` and `ivory apply` against the real registry: a
//! policy takes its cosign key from a ConfigMap through `resource.Get` (Kyverno's
//! "key from a ConfigMap" scenario). The ConfigMap's key decides; without the file the read
//! fails and the failurePolicy decides (never an empty answer); a file ivory refuses (a
//! Secret) is an error naming it. `ivory serve --cluster-resources` (file mode) answers the same.

use crate::cli_util::{ivory, push_fixture, registry_and_ca, write};
use ivory_testkit::policy::pod_policy;

use crate::util::{Ivory, VERIFY_SIGNED, pod_review};
use ivory_testkit::fixtures_dir;

fn policy(glob: &str) -> String {
    pod_policy(
        "key-from-configmap",
        glob,
        &format!(
            "  variables:
    - name: keys
      expression: resource.Get('v1', 'configmaps', 'ivory', 'cosign-keys')
  attestors:
    - name: key
      cosign:
        key:
          expression: variables.keys.data.key
        ctlog:
          insecureIgnoreTlog: true
          insecureIgnoreSCT: true
{VERIFY_SIGNED}"
        ),
    )
}

/// The ConfigMap holding `key` (a PEM public key) as `data.key`.
fn config_map(key: &str) -> String {
    let pem = std::fs::read_to_string(fixtures_dir().join("keys").join(key)).unwrap();
    let indented: String = pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: cosign-keys
  namespace: ivory
data:
  key: |
{indented}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_given_as_a_cluster_resource_holds_the_key() {
    let (h, dir, ca) = registry_and_ca().await;
    let (signed, _) = push_fixture(&h, "sig-p256").await;
    let policy = write(
        dir.path(),
        "policy.yaml",
        &policy(&format!("{}/*", h.host())),
    );
    let trusted = write(dir.path(), "trusted.yaml", &config_map("cosign-p256.pub"));
    let untrusted = write(
        dir.path(),
        "untrusted.yaml",
        &config_map("untrusted-p256.pub"),
    );
    let secret = write(
        dir.path(),
        "secret.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: ivory\n",
    );
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let verify = |cluster: Option<&std::path::Path>| {
        let mut args = vec![
            "verify".to_owned(),
            signed.clone(),
            "--policy".into(),
            path(&policy),
            "--registry-ca".into(),
            path(&ca),
            "-o".into(),
            "json".into(),
        ];
        if let Some(c) = cluster {
            args.extend(["--cluster-resources".into(), path(c)]);
        }
        ivory(args)
    };

    let run = verify(Some(&trusted)).await;
    assert_eq!(
        run.code, 0,
        "the ConfigMap's key verifies: {}\n{}",
        run.stdout, run.stderr
    );
    let run = verify(Some(&untrusted)).await;
    assert_eq!(
        run.code, 1,
        "another key: not verified: {}\n{}",
        run.stdout, run.stderr
    );
    let run = verify(None).await;
    assert_eq!(
        run.code, 2,
        "no cluster data: an error: {}\n{}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout.contains("cluster data unavailable"),
        "{}",
        run.stdout
    );
    let run = verify(Some(&secret)).await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("--cluster-resources") && run.stderr.contains("does not serve Secrets"),
        "{}",
        run.stderr
    );

    // apply: the same policy on a Pod, with the resource files in a folder.
    let folder = dir.path().join("cluster");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy(&trusted, folder.join("keys.yaml")).unwrap();
    let pod = write(
        dir.path(),
        "pod.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: team-a\nspec:\n  containers:\n    - name: c\n      image: {signed}\n"
        ),
    );
    let run = ivory([
        "apply",
        "--policy",
        &path(&policy),
        "--resource",
        &path(&pod),
        "--cluster-resources",
        &path(&folder),
        "--registry-ca",
        &path(&ca),
        "-o",
        "json",
    ])
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json()["summary"]["allowed"], 1, "{}", run.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_in_file_mode_reads_cluster_resources_files() {
    let (h, dir, ca) = registry_and_ca().await;
    let (signed, digest) = push_fixture(&h, "sig-p256").await;
    let policy = write(
        dir.path(),
        "policy.yaml",
        &policy(&format!("{}/*", h.host())),
    );
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    // As the mutating stage leaves it: pinned.
    let review = pod_review("u-1", &[&format!("{signed}@{digest}")]);
    for (key, allowed) in [("cosign-p256.pub", true), ("untrusted-p256.pub", false)] {
        let cluster = write(dir.path(), "cluster.yaml", &config_map(key));
        let ivory = Ivory::start_in(
            dir.path(),
            &[
                "--policies".into(),
                path(&policy),
                "--cluster-resources".into(),
                path(&cluster),
                "--registry-ca".into(),
                path(&ca),
            ],
        )
        .await;
        let resp = ivory
            .review("/ivpol/validate/key-from-configmap", &review)
            .await;
        assert_eq!(resp["allowed"], allowed, "{key}: {resp}\n{}", ivory.logs());
    }
    // Without the file: the read fails, failurePolicy Fail denies, naming why.
    let ivory = Ivory::start_in(
        dir.path(),
        &[
            "--policies".into(),
            path(&policy),
            "--registry-ca".into(),
            path(&ca),
        ],
    )
    .await;
    let resp = ivory
        .review("/ivpol/validate/key-from-configmap", &review)
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert!(
        resp.to_string().contains("cluster data unavailable"),
        "{resp}"
    );
}

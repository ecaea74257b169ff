//! Policy files written while `ivory serve` watches them: someone who rewrites a policy file
//! non-atomically (`cat >`, scp, configuration management) exposes prefixes of it, and a prefix
//! can be a valid policy that lost a check. None may ever be enforced.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::util::{Ivory, Tls, pod_review, policies_dir, policy};
use ivory_testkit::eventually;

const VALIDATE: &str = "/ivpol/validate/guard";

/// A policy whose last validation denies Pods named `bad`; every prefix that ends after one
/// of the earlier validations is a valid policy without that check.
fn guard(message: &str) -> String {
    let body = format!(
        "  failurePolicy: Fail
  attestors: []
  validationConfigurations: {{mutateDigest: false, verifyDigest: false, required: false}}
  validations:
    - expression: \"true\"
    - expression: \"size(images.containers) > 0\"
    - expression: \"object.metadata.name.size() > 0\"
    - expression: \"object.metadata.name != 'bad'\"
      message: {message}
"
    );
    policy("guard", "example.invalid/*", &body)
}

fn bad_pod(uid: &str) -> serde_json::Value {
    let mut review = pod_review(uid, &["example.invalid/app:v1"]);
    review["request"]["object"]["metadata"]["name"] = "bad".into();
    review["request"]["name"] = "bad".into();
    review
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_is_never_enforced_half_written() {
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let file = policies.join("guard.yaml");
    std::fs::write(&file, guard("bad pods are denied (v1)")).unwrap();
    let tls = Tls::write(dir.path(), "ivory test CA");
    let ivory = Arc::new(
        Ivory::start(
            &tls,
            // `Ivory::start` polls every 300 ms (`--reload-interval`).
            &["--policies".into(), policies.display().to_string()],
        )
        .await,
    );
    let first = ivory.review(VALIDATE, &bad_pod("before")).await;
    assert_eq!(first["allowed"], false, "{first}");

    // Reviews of the bad Pod all through the rewrite.
    let done = Arc::new(AtomicBool::new(false));
    let (admitted, asked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let prober = {
        let (ivory, done, admitted, asked) =
            (ivory.clone(), done.clone(), admitted.clone(), asked.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Acquire) {
                let n = asked.fetch_add(1, Ordering::AcqRel);
                let r = ivory.review(VALIDATE, &bad_pod(&format!("p{n}"))).await;
                if r["allowed"] == true {
                    admitted.fetch_add(1, Ordering::AcqRel);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // The new version goes in as a slow writer would put it: truncated, then line by line,
    // each prefix on disk for 200 ms (under one poll interval, so no two polls read the same
    // prefix; an ivory that applies whatever it reads enforces several of them).
    let new = guard("bad pods are denied (v2)");
    let lines: Vec<&str> = new.split_inclusive('\n').collect();
    let cut = lines
        .iter()
        .position(|l| l.contains("validations:"))
        .unwrap();
    let mut out = std::fs::File::create(&file).unwrap();
    out.write_all(lines[..=cut].concat().as_bytes()).unwrap();
    out.flush().unwrap();
    for line in &lines[cut + 1..] {
        tokio::time::sleep(Duration::from_millis(200)).await;
        out.write_all(line.as_bytes()).unwrap();
        out.flush().unwrap();
    }
    drop(out);

    // The finished file is applied once it has stopped changing.
    let applied = eventually(
        "the finished file's policy (v2) to apply",
        Duration::from_secs(10),
        || async {
            let r = ivory.review(VALIDATE, &bad_pod("after")).await;
            r["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("(v2)"))
        },
    )
    .await
    .is_ok();
    done.store(true, Ordering::Release);
    prober.await.unwrap();
    assert!(applied, "{}", ivory.logs());
    let (asked, admitted) = (
        asked.load(Ordering::Acquire),
        admitted.load(Ordering::Acquire),
    );
    eprintln!("{asked} reviews of the bad Pod during the rewrite, {admitted} admitted");
    assert!(asked > 20, "{asked} reviews");
    assert_eq!(admitted, 0, "a half-written policy was enforced");
    assert!(
        ivory
            .logs()
            .contains("applying them once they stop changing"),
        "{}",
        ivory.logs()
    );
}

//! `ivory apply --exception` and `ivory verify --exception` against the real registry: an
//! exception whose conditions hold skips the policy (no verification, no pin), one whose
//! conditions do not changes nothing, and a broken exception file is an error naming it.

use crate::cli_util::{ivory, push_fixture, registry_and_ca, write, write_require_signed};

fn exception(condition: &str) -> String {
    format!(
        "apiVersion: policies.kyverno.io/v1
kind: PolicyException
metadata:
  name: allow-debug
  namespace: ops
spec:
  policyRefs:
    - name: require-signed
      kind: ImageValidatingPolicy
  matchConditions:
    - name: cond
      expression: \"{condition}\"
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_and_verify_take_exception_files() {
    let (h, dir, ca) = registry_and_ca().await;
    let (unsigned, _) = push_fixture(&h, "unsigned").await;
    let policy = write_require_signed(dir.path(), "policy.yaml", &h);
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: debug\nspec:\n  containers:\n    - name: c\n      image: {unsigned}\n"
    );
    let resource = write(dir.path(), "pod.yaml", &pod);
    let matching = write(
        dir.path(),
        "matching.yaml",
        &exception("object.metadata.name == 'debug'"),
    );
    let other = write(
        dir.path(),
        "other.yaml",
        &exception("object.metadata.name == 'web'"),
    );
    let (ca, policy, resource) = (
        ca.to_str().unwrap().to_owned(),
        policy.to_str().unwrap().to_owned(),
        resource.to_str().unwrap().to_owned(),
    );
    let apply = |exception: Option<&std::path::Path>| {
        let mut args = vec![
            "apply".to_owned(),
            "--policy".into(),
            policy.clone(),
            "--resource".into(),
            resource.clone(),
            "--registry-ca".into(),
            ca.clone(),
            "-o".into(),
            "json".into(),
        ];
        if let Some(e) = exception {
            args.extend(["--exception".into(), e.display().to_string()]);
        }
        ivory(args)
    };

    let run = apply(None).await;
    assert_eq!(
        run.code, 1,
        "denied without the exception: {}\n{}",
        run.stdout, run.stderr
    );
    let run = apply(Some(&other)).await;
    assert_eq!(
        run.code, 1,
        "an exception for another pod: {}\n{}",
        run.stdout, run.stderr
    );
    let run = apply(Some(&matching)).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    let applied = &doc["resources"][0];
    assert!(
        applied["patch"].as_array().is_none_or(Vec::is_empty),
        "excepted: no pin: {applied}"
    );
    assert!(
        applied
            .to_string()
            .contains("rule is skipped due to policy exception: ops/allow-debug"),
        "{applied}"
    );

    // verify: the synthetic Pod is named ivory-verify.
    let verify_exception = write(
        dir.path(),
        "verify.yaml",
        &exception("object.metadata.name == 'ivory-verify'"),
    );
    let verify = |extra: &[&str]| {
        let mut args = vec![
            "verify",
            &unsigned,
            "--policy",
            &policy,
            "--registry-ca",
            &ca,
            "-o",
            "json",
        ];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        ivory(args)
    };
    let run = verify(&[]).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let run = verify(&["--exception", verify_exception.to_str().unwrap()]).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    // A broken exception file is an error naming it.
    let broken = write(
        dir.path(),
        "broken.yaml",
        &exception("object.metadata.name ==").replace("policyRefs", "policyRefz"),
    );
    let run = apply(Some(&broken)).await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("broken.yaml") && run.stderr.contains("--exception"),
        "{}",
        run.stderr
    );
}

//! The egress rule through the binary: `ivory verify` and `ivory serve` under a policy whose
//! glob selects every image, or that reads image data, asked about the metadata address in
//! other spellings (in a private network namespace with a stand-in there, see
//! `ivory_testkit::in_metadata_netns`), and `--egress-private deny` and `--egress-allow`
//! against the real registry.

use serde_json::Value;

use ivory_testkit::{MetadataListener, in_metadata_netns};

use crate::cli_util::{
    Run, ivory, policy_args, push_fixture, registry_and_ca, write, write_require_signed,
};
use crate::util::{Ivory, VERIFY_SIGNED, key_attestor, pod_review, policies_dir, policy};

/// The message of `name`'s entry in `verify -o json`'s answer.
fn message(run: &Run, name: &str) -> String {
    let doc = run.json();
    let entry = doc["images"]
        .as_array()
        .and_then(|all| all.iter().find(|i| i["image"] == name))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(entry["verdict"], "error", "{name}: {doc:#}\n{}", run.stderr);
    entry["message"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broad_glob_never_reaches_the_metadata_address() {
    if !in_metadata_netns("cli_egress::a_broad_glob_never_reaches_the_metadata_address") {
        return;
    }
    let metadata = MetadataListener::bind();
    let dir = tempfile::tempdir().unwrap();
    let body = format!("{}{VERIFY_SIGNED}", key_attestor());
    let file = write(dir.path(), "p.yaml", &policy("everything", "*", &body));
    let file = file.display().to_string();
    for image in [
        "2852039166:80/latest/meta-data:1",
        "0xa9fea9fe:80/latest/meta-data:1",
        "169.254.43518:80/latest/meta-data:1",
        "[::ffff:169.254.169.254]:80/latest/meta-data:1",
        "metadata.ivory.test:80/latest/meta-data:1",
    ] {
        let run = ivory(["verify", "--policy", &file, "-o", "json", image]).await;
        assert_eq!(run.code, 2, "{image}: {}\n{}", run.stdout, run.stderr);
        let said = message(&run, image);
        for part in [image, "169.254.169.254", "--egress-allow 169.254.169.254"] {
            assert!(said.contains(part), "{image}: {part} not in {said}");
        }
    }
    assert_eq!(metadata.connections(), 0, "ivory connected to the stand-in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_addresses_are_refused_under_deny_unless_allow_listed() {
    let (h, dir, ca) = registry_and_ca().await;
    let (signed, _) = push_fixture(&h, "sig-p256").await;
    let file = write_require_signed(dir.path(), "signed.yaml", &h);
    let verify = |extra: &[&str]| {
        let mut args = policy_args("verify", &file, &ca);
        args.extend(["-o", "json", "--egress-private", "deny"].map(String::from));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args.push(signed.clone());
        ivory(args)
    };
    h.reset_requests();
    let run = verify(&[]).await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let said = message(&run, &signed);
    for part in [signed.as_str(), "127.0.0.1", "--egress-private=allow"] {
        assert!(said.contains(part), "{part} not in {said}");
    }
    assert!(
        h.requests().is_empty(),
        "the registry saw {:?}",
        h.requests()
    );

    let run = verify(&["--egress-allow", "127.0.0.0/8"]).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    let run = verify(&["--egress-allow", "2852039166"]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("2852039166"), "{}", run.stderr);
}

/// A Pod naming the metadata address, before `ivory serve`: under a broad glob (verification)
/// and to a policy that reads every container's image data (a late fetch outside its glob).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_never_reaches_the_metadata_address() {
    if !in_metadata_netns("cli_egress::the_webhook_never_reaches_the_metadata_address") {
        return;
    }
    let metadata = MetadataListener::bind();
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let verify = format!("{}{VERIFY_SIGNED}", key_attestor());
    let image_data = "  validationConfigurations:
    verifyDigest: false
    required: false
  attestors: []
  validations:
    - expression: >-
        object.spec.containers.all(c, image.GetMetadata(c.image).config.os == 'linux')
";
    for (name, glob, body) in [
        ("everything", "*", verify.as_str()),
        ("image-data", "nothing.example/*", image_data),
    ] {
        let path = policies.join(format!("{name}.yaml"));
        std::fs::write(path, policy(name, glob, body)).unwrap();
    }
    let ivory = Ivory::start_policies(dir.path(), &policies).await;
    for image in [
        "2852039166:80/latest/meta-data:1",
        "0xa9fea9fe:80/latest/meta-data:1",
        "metadata.ivory.test:80/latest/meta-data:1",
    ] {
        for route in ["everything", "image-data"] {
            let review = pod_review("u-1", &[image]);
            let resp = ivory
                .review(&format!("/ivpol/validate/{route}"), &review)
                .await;
            assert_eq!(resp["allowed"], false, "{route} {image}: {resp}");
            let said = resp["status"]["message"].as_str().unwrap_or_default();
            for part in [image, "169.254.169.254", "--egress-allow 169.254.169.254"] {
                assert!(said.contains(part), "{route} {image}: {part} not in {said}");
            }
        }
    }
    assert_eq!(
        metadata.connections(),
        0,
        "ivory serve connected to the stand-in"
    );
}

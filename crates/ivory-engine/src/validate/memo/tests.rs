//! A kept result is never reused for different inputs: memoized and fresh decisions agree on
//! random reviews, random verdicts and random policy sets.

use std::sync::Arc;
use std::time::Duration;

use ivory_policy::CompiledPolicy;
use proptest::prelude::*;
use serde_json::json;

use super::DecisionMemo;
use crate::admission::AdmissionRequest;
use crate::decision::Decision;
use crate::resources::NoResources;
use crate::testing::FakeVerifier;
use crate::validate::validate_memoized;

const IMAGES: [&str; 4] = [
    "ghcr.io/acme/app@sha256:1111111111111111111111111111111111111111111111111111111111111111",
    "ghcr.io/acme/side@sha256:2222222222222222222222222222222222222222222222222222222222222222",
    "ghcr.io/acme/init:v1",
    "docker.io/library/nginx:1",
];

const KEY: &str = "        -----BEGIN PUBLIC KEY-----
        MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv
        DLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==
        -----END PUBLIC KEY-----
";

/// Policies of several shapes: pure ones (memoizable) and ones reading the request.
fn policies() -> Vec<CompiledPolicy> {
    let specs = [
        // Kyverno's common shape: every image signed.
        (
            "all-signed",
            "Deny",
            true,
            "validations:\n- expression: \"images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)\"\n  message: unsigned\n",
        ),
        // Variables and a message expression over images only.
        (
            "few",
            "Warn",
            false,
            "variables:\n- name: n\n  expression: \"size(images.containers) + size(images.initContainers)\"\nvalidations:\n- expression: \"variables.n < 3\"\n  messageExpression: \"'too many: ' + string(variables.n)\"\n",
        ),
        // Reads the object: never memoizable.
        (
            "named",
            "Deny",
            false,
            "validations:\n- expression: \"object.metadata.name != 'evil' && images.initContainers.all(i, verifyImageSignatures(i, [attestors.cosign]) > 0)\"\n",
        ),
        // Audit only, required.
        (
            "init-signed",
            "Audit",
            true,
            "validations:\n- expression: \"images.initContainers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)\"\n",
        ),
    ];
    specs
        .iter()
        .map(|(name, action, required, body)| compiled(name, action, *required, body))
        .collect()
}

/// An ImageValidatingPolicy over `ghcr.io/*` Pods with one key attestor and `body` (its
/// variables and validations).
fn compiled(name: &str, action: &str, required: bool, body: &str) -> CompiledPolicy {
    let yaml = format!(
        "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata:\n  name: {name}\nspec:\n  validationActions: [{action}]\n  matchConstraints:\n    resourceRules:\n    - apiGroups: ['']\n      apiVersions: ['v1']\n      operations: ['CREATE']\n      resources: ['pods']\n  matchImageReferences:\n  - glob: 'ghcr.io/*'\n  validationConfigurations:\n    verifyDigest: false\n    required: {required}\n  attestors:\n  - name: cosign\n    cosign:\n      key:\n        data: |\n{}{}",
        KEY.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>(),
        body.lines().map(|l| format!("  {l}\n")).collect::<String>()
    );
    let report = ivory_policy::load_str(&yaml, "memo.yaml");
    assert!(report.errors.is_empty(), "{yaml}\n{:?}", report.errors);
    report.policies.into_iter().next().expect("one policy")
}

fn pod(name: &str, containers: &[usize], init: &[usize]) -> AdmissionRequest {
    let list = |picks: &[usize]| -> Vec<serde_json::Value> {
        picks
            .iter()
            .enumerate()
            .map(|(i, p)| json!({"name": format!("c{i}"), "image": IMAGES[p % IMAGES.len()]}))
            .collect()
    };
    serde_json::from_value(json!({
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": name,
        "namespace": "default",
        "operation": "CREATE",
        "object": {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": list(containers), "initContainers": list(init)},
        },
    }))
    .expect("a Pod review")
}

fn verifier(signed: &[bool]) -> FakeVerifier {
    IMAGES
        .iter()
        .zip(signed)
        .filter(|(_, signed)| **signed)
        .fold(FakeVerifier::new(), |v, (image, _)| v.sign(image, "cosign"))
}

/// One admission: images by index, which images are signed, which policies apply.
#[derive(Clone, Debug)]
struct Admission {
    name_is_evil: bool,
    containers: Vec<usize>,
    init: Vec<usize>,
    signed: Vec<bool>,
    policies: Vec<bool>,
}

fn admission() -> impl Strategy<Value = Admission> {
    (
        any::<bool>(),
        prop::collection::vec(0..4usize, 0..4),
        prop::collection::vec(0..4usize, 0..3),
        prop::collection::vec(any::<bool>(), 4),
        prop::collection::vec(any::<bool>(), 4),
    )
        .prop_map(
            |(name_is_evil, containers, init, signed, policies)| Admission {
                name_is_evil,
                containers,
                init,
                signed,
                policies,
            },
        )
}

async fn judge(
    all: &[CompiledPolicy],
    admission: &Admission,
    memo: Option<&DecisionMemo>,
) -> Decision {
    let selected: Vec<&CompiledPolicy> = all
        .iter()
        .zip(&admission.policies)
        .filter(|(_, on)| **on)
        .map(|(p, _)| p)
        .collect();
    let name = if admission.name_is_evil {
        "evil"
    } else {
        "web"
    };
    let req = pod(name, &admission.containers, &admission.init);
    let deadline = ivory_clock::now() + Duration::from_secs(10);
    let verifier = verifier(&admission.signed);
    // No memo: every policy evaluated afresh, as `validate` does.
    let decision = validate_memoized(
        &verifier,
        &NoResources,
        &selected,
        &req,
        None,
        deadline,
        memo,
    )
    .await;
    Arc::unwrap_or_clone(decision)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn memoized_and_fresh_decisions_agree(sequence in prop::collection::vec(admission(), 1..12)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let all = policies();
        let memo = DecisionMemo::default();
        for admission in &sequence {
            // Twice with the memo: the second reuses what the first kept, where it may.
            for _ in 0..2 {
                let memoized = runtime.block_on(judge(&all, admission, Some(&memo)));
                let fresh = runtime.block_on(judge(&all, admission, None));
                prop_assert_eq!(&memoized, &fresh, "{:?}", admission);
            }
        }
    }
}

#[tokio::test]
async fn a_kept_result_is_reused_only_for_the_same_answers() {
    let all = policies();
    let memo = DecisionMemo::default();
    let signed = Admission {
        name_is_evil: false,
        containers: vec![0, 1],
        init: vec![],
        signed: vec![true, true, false, false],
        policies: vec![true, false, true, false],
    };
    let first = judge(&all, &signed, Some(&memo)).await;
    assert!(first.allowed, "{first:?}");
    assert_eq!(memo.hits(), 0);
    assert_eq!(judge(&all, &signed, Some(&memo)).await, first);
    // The pure policy was reused; the one reading the object never is.
    assert_eq!(memo.hits(), 1);
    // The same images, one signature gone: the kept result does not apply.
    let unsigned = Admission {
        signed: vec![true, false, false, false],
        ..signed.clone()
    };
    let denied = judge(&all, &unsigned, Some(&memo)).await;
    assert!(!denied.allowed, "{denied:?}");
    assert_eq!(memo.hits(), 1);
    assert_eq!(denied, judge(&all, &unsigned, None).await);
}

#[test]
fn policies_reading_the_request_are_not_pure() {
    let all = policies();
    let pure: Vec<bool> = all.iter().map(super::policy_is_pure).collect();
    assert_eq!(pure, [true, true, false, true]);
}

/// `time.now()` answers differently later for the same images and verdicts: a policy that
/// reads it (an age check converted from Kyverno's `time_since`) is evaluated every time.
#[test]
fn policies_reading_the_clock_are_not_pure() {
    let aged = compiled(
        "aged",
        "Deny",
        true,
        "validations:\n- expression: \"time.now() < timestamp('2100-01-01T00:00:00Z') && images.containers.all(i, verifyImageSignatures(i, [attestors.cosign]) > 0)\"\n",
    );
    assert!(!super::policy_is_pure(&aged));
}

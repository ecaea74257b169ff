//! A kept route's decision follows every matching input: requests that differ from a kept one
//! in one input at a time are decided as if nothing were kept, and dropping any input from the
//! key (the mutation check) makes that fail. Random requests over every input agree too.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ivory_policy::CompiledPolicy;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{Input, without_input};
use crate::admission::AdmissionRequest;
use crate::decision::Decision;
use crate::resources::NoResources;
use crate::testing::FakeVerifier;
use crate::validate::{DecisionMemo, validate_memoized};

const SIGNED: &str =
    "ghcr.io/acme/app@sha256:1111111111111111111111111111111111111111111111111111111111111111";
const UNSIGNED: &str =
    "ghcr.io/acme/side@sha256:2222222222222222222222222222222222222222222222222222222222222222";
const TAGGED: &str = "ghcr.io/acme/app:v1";

const KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv
DLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==
-----END PUBLIC KEY-----
";

/// A Deny policy over `ghcr.io/*` with one key attestor: `constraints` is its
/// matchConstraints body, `validation` its one expression.
fn policy(name: &str, constraints: &str, extra: &str, validation: &str) -> CompiledPolicy {
    let indent =
        |text: &str, by: &str| -> String { text.lines().map(|l| format!("{by}{l}\n")).collect() };
    let yaml = format!(
        "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata:\n  name: {name}\n{extra}spec:\n  validationActions: [Deny]\n  matchConstraints:\n{}  matchImageReferences:\n  - glob: 'ghcr.io/*'\n  validationConfigurations:\n    verifyDigest: {}\n    required: false\n  attestors:\n  - name: cosign\n    cosign:\n      key:\n        data: |\n{}  validations:\n  - expression: \"{validation}\"\n    message: {name} refused\n",
        indent(constraints, "    "),
        !extra.is_empty(),
        indent(KEY, "          "),
    );
    let report = ivory_policy::load_str(&yaml, "reuse.yaml");
    assert!(report.errors.is_empty(), "{yaml}\n{:?}", report.errors);
    report.policies.into_iter().next().expect("one policy")
}

const SIGNED_CONTAINERS: &str =
    "images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0)";

fn rules(operations: &str, resources: &str) -> String {
    format!(
        "resourceRules:\n- apiGroups: ['']\n  apiVersions: ['v1']\n  operations: [{operations}]\n  resources: [{resources}]\n"
    )
}

/// The route's policies, one set of objects for every request (a route's policies are the
/// same objects until a reload).
static ROUTE: LazyLock<Vec<CompiledPolicy>> = LazyLock::new(policies);

/// The `signed` policy's next version.
static SIGNED_V2: LazyLock<CompiledPolicy> =
    LazyLock::new(|| policy("signed", &rules("CREATE", "pods"), "", "false"));

fn route() -> Vec<&'static CompiledPolicy> {
    ROUTE.iter().collect()
}

/// Policies that, between them, read every matching input.
fn policies() -> Vec<CompiledPolicy> {
    vec![
        // operation, resource, sub-resource, images
        policy("signed", &rules("CREATE", "pods"), "", SIGNED_CONTAINERS),
        // name
        policy(
            "named",
            &format!("{}  resourceNames: [web]\n", rules("CREATE, UPDATE", "'*'")),
            "",
            "false",
        ),
        // the resource and sub-resource the client addressed
        policy(
            "exact",
            &format!("matchPolicy: Exact\n{}", rules("CREATE, UPDATE", "pods")),
            "",
            "false",
        ),
        // object and old-object labels
        policy(
            "labelled",
            &format!(
                "objectSelector:\n  matchLabels: {{app: web}}\n{}",
                rules("CREATE, UPDATE", "'*'")
            ),
            "",
            "false",
        ),
        // namespace, its labels and their knownness
        policy(
            "team",
            &format!(
                "namespaceSelector:\n  matchLabels: {{team: a}}\n{}",
                rules("CREATE, UPDATE", "'*'")
            ),
            "",
            "false",
        ),
        // the resource the API server converted the request to
        policy(
            "current",
            "resourceRules:\n- apiGroups: ['']\n  apiVersions: ['*']\n  operations: ['*']\n  resources: ['*']\nexcludeResourceRules:\n- apiGroups: ['']\n  apiVersions: [v2]\n  operations: ['*']\n  resources: ['*']\n",
            "",
            "false",
        ),
        // the object's kind and the request's: pinning demands digests of Pods only
        policy(
            "pinned",
            &rules("CREATE, UPDATE", "'*'"),
            "  annotations:\n    ivory.dev/digest-pinning: pods-only\n",
            "true",
        ),
    ]
}

/// Every matching input of one request, in a form a test changes one field of.
#[derive(Clone, Debug)]
struct Spec {
    policies: Vec<&'static CompiledPolicy>,
    operation: &'static str,
    kind: &'static str,
    version: &'static str,
    sub_resource: Option<&'static str>,
    request_version: Option<&'static str>,
    request_sub_resource: Option<&'static str>,
    name: &'static str,
    namespace: &'static str,
    namespace_labels: Option<BTreeMap<&'static str, &'static str>>,
    labels_unknown: bool,
    labels: BTreeMap<&'static str, &'static str>,
    old_labels: Option<BTreeMap<&'static str, &'static str>>,
    subject_kind: Option<&'static str>,
    containers: Vec<&'static str>,
}

fn base() -> Spec {
    Spec {
        policies: route(),
        operation: "CREATE",
        kind: "Deployment",
        version: "v1",
        sub_resource: None,
        request_version: None,
        request_sub_resource: None,
        name: "web",
        namespace: "shop",
        namespace_labels: Some(BTreeMap::from([("team", "a")])),
        labels_unknown: false,
        labels: BTreeMap::from([("app", "web")]),
        old_labels: None,
        subject_kind: Some("Deployment"),
        containers: vec![SIGNED],
    }
}

impl Spec {
    fn request(&self) -> (AdmissionRequest, Option<Value>) {
        let object = |labels: &BTreeMap<&str, &str>| {
            let mut object = json!({
                "apiVersion": "v1",
                "metadata": {"name": self.name, "namespace": self.namespace, "labels": labels},
                "spec": {"containers": self.containers.iter().enumerate()
                    .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
                    .collect::<Vec<_>>()},
            });
            if let Some(kind) = self.subject_kind {
                object["kind"] = json!(kind);
            }
            object
        };
        let mut review = json!({
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": self.kind},
            "resource": {"group": "", "version": self.version, "resource": "pods"},
            "name": self.name,
            "namespace": self.namespace,
            "operation": self.operation,
            "object": object(&self.labels),
        });
        if let Some(sub) = self.sub_resource {
            review["subResource"] = json!(sub);
        }
        if let Some(version) = self.request_version {
            review["requestResource"] =
                json!({"group": "", "version": version, "resource": "pods"});
        }
        if let Some(sub) = self.request_sub_resource {
            review["requestSubResource"] = json!(sub);
        }
        if let Some(old) = &self.old_labels {
            review["oldObject"] = object(old);
        }
        let mut req: AdmissionRequest = serde_json::from_value(review).expect("a review");
        req.namespace_labels_unknown = self.labels_unknown;
        let namespace = self.namespace_labels.as_ref().map(|labels| {
            json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": self.namespace, "labels": labels}})
        });
        (req, namespace)
    }
}

fn verifier() -> FakeVerifier {
    FakeVerifier::new()
        .holding_verdicts()
        .sign(SIGNED, "cosign")
}

async fn judge(spec: &Spec, memo: Option<&DecisionMemo>) -> Decision {
    judge_by(&verifier(), spec, memo).await
}

/// `spec` judged with `verifier`'s answers (`None`: no memo, every policy evaluated afresh).
async fn judge_by(verifier: &FakeVerifier, spec: &Spec, memo: Option<&DecisionMemo>) -> Decision {
    let (req, namespace) = spec.request();
    let deadline = ivory_clock::now() + Duration::from_secs(10);
    let (policies, namespace) = (&spec.policies, namespace.as_ref());
    let decision = validate_memoized(
        verifier,
        &NoResources,
        policies,
        &req,
        namespace,
        deadline,
        memo,
    )
    .await;
    Arc::unwrap_or_clone(decision)
}

/// For each input, a kept request and one that differs from it in that input alone.
fn one_input_apart() -> Vec<(Input, Spec, Spec)> {
    let with = |change: &dyn Fn(&mut Spec)| {
        let mut spec = base();
        change(&mut spec);
        spec
    };
    let pods_only = |spec: &mut Spec| spec.containers = vec![TAGGED];
    vec![
        (
            Input::Policies,
            base(),
            with(&|s| s.policies[0] = &SIGNED_V2),
        ),
        (Input::Operation, base(), with(&|s| s.operation = "UPDATE")),
        // The client's resource stays: only the converted one changes.
        (
            Input::Resource,
            with(&|s| s.request_version = Some("v1")),
            with(&|s| {
                s.request_version = Some("v1");
                s.version = "v2";
            }),
        ),
        (
            Input::SubResource,
            base(),
            with(&|s| s.sub_resource = Some("status")),
        ),
        (
            Input::RequestResource,
            base(),
            with(&|s| s.request_version = Some("v1beta1")),
        ),
        (
            Input::RequestSubResource,
            base(),
            with(&|s| s.request_sub_resource = Some("status")),
        ),
        (Input::Name, base(), with(&|s| s.name = "db")),
        // Without a Namespace object the selector's error names the namespace.
        (
            Input::Namespace,
            with(&|s| s.namespace_labels = None),
            with(&|s| {
                s.namespace_labels = None;
                s.namespace = "bank";
            }),
        ),
        (
            Input::NamespaceLabels,
            base(),
            with(&|s| s.namespace_labels = Some(BTreeMap::from([("team", "b")]))),
        ),
        (
            Input::NamespaceLabelsUnknown,
            with(&|s| s.namespace_labels = Some(BTreeMap::from([("team", "b")]))),
            with(&|s| {
                s.namespace_labels = Some(BTreeMap::from([("team", "b")]));
                s.labels_unknown = true;
            }),
        ),
        (
            Input::ObjectLabels,
            base(),
            with(&|s| s.labels = BTreeMap::from([("app", "db")])),
        ),
        (
            Input::OldObjectLabels,
            with(&|s| {
                s.operation = "UPDATE";
                s.labels = BTreeMap::from([("app", "db")]);
                s.old_labels = Some(BTreeMap::from([("app", "web")]));
            }),
            with(&|s| {
                s.operation = "UPDATE";
                s.labels = BTreeMap::from([("app", "db")]);
                s.old_labels = Some(BTreeMap::from([("app", "db")]));
            }),
        ),
        // A tag under `pods-only` pinning: a Pod must carry a digest, a Deployment need not.
        (
            Input::SubjectKind,
            with(&pods_only),
            with(&|s| {
                pods_only(s);
                s.subject_kind = Some("Pod");
            }),
        ),
        (
            Input::Kind,
            with(&|s| {
                pods_only(s);
                s.subject_kind = None;
            }),
            with(&|s| {
                pods_only(s);
                s.subject_kind = None;
                s.kind = "Pod";
            }),
        ),
        (
            Input::Images,
            base(),
            with(&|s| s.containers = vec![UNSIGNED]),
        ),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
}

/// Keeps `kept`'s decision (and checks it is reused), then judges `changed` with that memo:
/// the decision it gets and the one it gets from no memo.
fn after_kept(
    runtime: &tokio::runtime::Runtime,
    kept: &Spec,
    changed: &Spec,
) -> (Decision, Decision) {
    let memo = DecisionMemo::default();
    let first = runtime.block_on(judge(kept, Some(&memo)));
    let again = runtime.block_on(judge(kept, Some(&memo)));
    assert_eq!(first, again);
    assert_eq!(memo.route_hits(), 1, "the kept request is reused: {kept:?}");
    let memoized = runtime.block_on(judge(changed, Some(&memo)));
    let fresh = runtime.block_on(judge(changed, None));
    (memoized, fresh)
}

#[test]
fn every_input_is_covered_by_a_case() {
    let covered: Vec<Input> = one_input_apart().iter().map(|(i, _, _)| *i).collect();
    let all = [
        Input::Policies,
        Input::Operation,
        Input::Kind,
        Input::Resource,
        Input::SubResource,
        Input::RequestResource,
        Input::RequestSubResource,
        Input::Name,
        Input::Namespace,
        Input::NamespaceLabels,
        Input::NamespaceLabelsUnknown,
        Input::ObjectLabels,
        Input::OldObjectLabels,
        Input::SubjectKind,
        Input::Images,
    ];
    for input in all {
        assert!(covered.contains(&input), "no case changes {input:?}");
    }
}

#[test]
fn the_decision_follows_each_input_alone() {
    let runtime = runtime();
    for (input, kept, changed) in one_input_apart() {
        let kept_fresh = runtime.block_on(judge(&kept, None));
        let (memoized, fresh) = after_kept(&runtime, &kept, &changed);
        assert_ne!(
            kept_fresh, fresh,
            "{input:?}: the change must change the decision"
        );
        assert_eq!(memoized, fresh, "{input:?}");
    }
}

/// The mutation check: with any one input left out of the key, the request that differs in
/// that input alone gets the kept decision, which is not its own.
#[test]
fn dropping_any_input_from_the_key_is_caught() {
    let runtime = runtime();
    for (input, kept, changed) in one_input_apart() {
        let (memoized, fresh) = without_input(input, || after_kept(&runtime, &kept, &changed));
        assert_ne!(
            memoized, fresh,
            "{input:?} left out of the key went unnoticed"
        );
    }
}

#[test]
fn a_verdict_that_changed_is_never_reused() {
    let runtime = runtime();
    let memo = DecisionMemo::default();
    let spec = Spec {
        policies: route().into_iter().take(1).collect(),
        ..base()
    };
    let allowed = runtime.block_on(judge(&spec, Some(&memo)));
    assert!(allowed.allowed, "{allowed:?}");
    // The same request, the signature gone: the verifier no longer holds the verdict.
    let unsigned = FakeVerifier::new().holding_verdicts();
    let denied = runtime.block_on(judge_by(&unsigned, &spec, Some(&memo)));
    assert!(!denied.allowed, "{denied:?}");
    assert_eq!(memo.route_hits(), 0);
    // A verifier that holds nothing (a background scan's) never reuses either.
    let plain = FakeVerifier::new().sign(SIGNED, "cosign");
    runtime.block_on(judge_by(&plain, &spec, Some(&memo)));
    assert_eq!(memo.route_hits(), 0);
}

#[test]
fn an_error_is_never_kept() {
    let runtime = runtime();
    let memo = DecisionMemo::default();
    let down = FakeVerifier::new()
        .holding_verdicts()
        .mode(crate::testing::Mode::Unavailable);
    for _ in 0..2 {
        let decision = runtime.block_on(judge_by(&down, &base(), Some(&memo)));
        assert!(!decision.allowed, "{decision:?}");
    }
    assert_eq!(memo.route_hits(), 0);
}

/// More routes than are kept: all are forgotten at the bound, and kept again as they come.
#[test]
fn routes_kept_are_bounded() {
    let runtime = runtime();
    let memo = DecisionMemo::default();
    let names: Vec<&'static str> = (0..super::MAX_ROUTES + 10)
        .map(|i| &*Box::leak(format!("web-{i}").into_boxed_str()))
        .collect();
    for name in &names {
        let spec = Spec { name, ..base() };
        runtime.block_on(judge(&spec, Some(&memo)));
        let (routes, bytes) = memo.routes().size();
        assert!(routes <= super::MAX_ROUTES && bytes <= super::MAX_BYTES);
    }
    let (routes, _) = memo.routes().size();
    assert!(
        routes < super::MAX_ROUTES,
        "forgotten at the bound: {routes}"
    );
    let spec = Spec {
        name: names[names.len() - 1],
        ..base()
    };
    runtime.block_on(judge(&spec, Some(&memo)));
    assert_eq!(memo.route_hits(), 1, "the last one is kept");
}

fn labels() -> impl Strategy<Value = BTreeMap<&'static str, &'static str>> {
    prop::collection::btree_map(
        prop::sample::select(vec!["app", "team"]),
        prop::sample::select(vec!["web", "db", "a", "b"]),
        0..3,
    )
}

fn spec() -> impl Strategy<Value = Spec> {
    let request = (
        prop::sample::select(vec!["CREATE", "UPDATE"]),
        prop::sample::select(vec!["Pod", "Deployment"]),
        prop::sample::select(vec!["v1", "v2"]),
        prop::option::of(prop::sample::select(vec!["status", "ephemeralcontainers"])),
        prop::option::of(prop::sample::select(vec!["v1", "v1beta1"])),
        prop::option::of(prop::sample::select(vec!["status"])),
        prop::sample::select(vec!["web", "db"]),
        prop::sample::select(vec!["shop", "bank", ""]),
    );
    let object = (
        prop::option::of(labels()),
        any::<bool>(),
        labels(),
        prop::option::of(labels()),
        prop::option::of(prop::sample::select(vec!["Pod", "Deployment"])),
        prop::collection::vec(prop::sample::select(vec![SIGNED, UNSIGNED, TAGGED]), 0..3),
        prop::collection::vec(any::<bool>(), 7),
    );
    (request, object).prop_map(|(r, o)| Spec {
        policies: route()
            .into_iter()
            .zip(o.6)
            .filter(|(_, on)| *on)
            .map(|(p, _)| p)
            .collect(),
        operation: r.0,
        kind: r.1,
        version: r.2,
        sub_resource: r.3,
        request_version: r.4,
        request_sub_resource: r.5,
        name: r.6,
        namespace: r.7,
        namespace_labels: o.0,
        labels_unknown: o.1,
        labels: o.2,
        old_labels: o.3,
        subject_kind: o.4,
        containers: o.5,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn kept_and_fresh_decisions_agree(sequence in prop::collection::vec(spec(), 1..10)) {
        let runtime = runtime();
        let memo = DecisionMemo::default();
        for spec in &sequence {
            for _ in 0..2 {
                let memoized = runtime.block_on(judge(spec, Some(&memo)));
                let fresh = runtime.block_on(judge(spec, None));
                prop_assert_eq!(&memoized, &fresh, "{:?}", spec);
            }
        }
    }
}

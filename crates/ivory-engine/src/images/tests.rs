use std::collections::BTreeMap;

use ivory_policy::compiled::ImageMatcher;
use serde_json::json;

use super::*;
use crate::admission::GroupVersionResource;
use crate::admission::testutil::{cel, glob, pod_rule, policy, request};
use crate::matching::MatchError;

const DIG: &str = "sha256:abababababababababababababababababababababababababababababababab";

fn map(init: &[&str], containers: &[&str], eph: &[&str]) -> BTreeMap<String, Vec<String>> {
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    BTreeMap::from([
        ("containers".to_owned(), owned(containers)),
        ("initContainers".to_owned(), owned(init)),
        ("ephemeralContainers".to_owned(), owned(eph)),
        ("imageVolumes".to_owned(), Vec::new()),
    ])
}

/// `req`'s pod spec (at `spec`) with two image volumes around a non-image volume.
fn with_image_volumes(
    mut req: crate::admission::AdmissionRequest,
    spec: &str,
) -> crate::admission::AdmissionRequest {
    let volumes = json!([
        {"name": "models", "image": {"reference": "ghcr.io/acme/models:v1", "pullPolicy": "IfNotPresent"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "tools", "image": {"reference": format!("TOOLS.example.com:443/kit@{DIG}")}},
        {"name": "broken", "image": {}},
    ]);
    let object = req.object.as_mut().unwrap();
    object.edit(|o| o.pointer_mut(spec).unwrap()["volumes"] = volumes);
    req
}

#[test]
fn image_volumes_are_extracted_like_containers() {
    let tools = format!("TOOLS.example.com:443/kit@{DIG}");
    for (file, spec) in [
        ("pod-create.json", "/spec"),
        ("deployment-create.json", "/spec/template/spec"),
        (
            "cronjob-create.json",
            "/spec/jobTemplate/spec/template/spec",
        ),
    ] {
        let req = with_image_volumes(request(file), spec);
        assert_eq!(
            builtin_images(&req)["imageVolumes"],
            vec!["ghcr.io/acme/models:v1".to_owned(), tools.clone()],
            "{file}"
        );
        let object = req.object.unwrap();
        let kind = object.kind().unwrap().to_owned();
        let volumes: Vec<(String, String, &str)> = image_pointers(&object, &kind)
            .into_iter()
            .filter(|at| at.field == IMAGE_VOLUMES)
            .map(|at| (at.pointer, at.image, at.field))
            .collect();
        assert_eq!(
            volumes,
            vec![
                (
                    format!("{spec}/volumes/0/image/reference"),
                    "ghcr.io/acme/models:v1".to_owned(),
                    IMAGE_VOLUMES
                ),
                (
                    format!("{spec}/volumes/2/image/reference"),
                    tools.clone(),
                    IMAGE_VOLUMES
                ),
            ],
            "{file}"
        );
    }
}

#[test]
fn builtin_images_per_kind() {
    let tool = format!("ghcr.io/org/tool@{DIG}");
    let pod_containers = [
        "nginx",
        "ghcr.io/kyverno/test-verify-image:signed",
        tool.as_str(),
    ];
    let cases: Vec<(&str, BTreeMap<String, Vec<String>>)> = vec![
        (
            "pod-create.json",
            map(&["busybox:1.36"], &pod_containers, &[]),
        ),
        (
            "pod-delete.json",
            map(&["busybox:1.36"], &pod_containers, &[]),
        ),
        (
            "pod-update.json",
            map(
                &["busybox:1.36"],
                &["nginx:1.27", pod_containers[1], pod_containers[2]],
                &[],
            ),
        ),
        (
            "pod-ephemeralcontainers.json",
            map(&["busybox:1.36"], &pod_containers, &["busybox:debug"]),
        ),
        (
            "deployment-create.json",
            map(
                &["alpine:3.20"],
                &["registry.example.com/team/api:1.0"],
                &[],
            ),
        ),
        (
            "statefulset-create.json",
            map(
                &["registry.example.com/team/migrate:2"],
                &["postgres:16"],
                &[],
            ),
        ),
        (
            "daemonset-create.json",
            map(&[], &["quay.io/prometheus/node-exporter:v1.8.0"], &[]),
        ),
        (
            "replicaset-create.json",
            map(&[], &["registry.example.com/team/api:1.0"], &[]),
        ),
        (
            "job-create.json",
            map(&["busybox"], &["registry.example.com/team/migrate:2"], &[]),
        ),
        (
            "cronjob-create.json",
            map(&["alpine"], &["registry.example.com/team/report:3"], &[]),
        ),
        // Not in Kyverno's validating extractor table: only spec.images applies.
        ("replicationcontroller-create.json", BTreeMap::new()),
        ("namespace-create.json", BTreeMap::new()),
        ("configmap-create.json", BTreeMap::new()),
    ];
    for (file, want) in cases {
        assert_eq!(builtin_images(&request(file)), want, "{file}");
    }
}

#[test]
fn builtin_images_by_gvr_not_kind() {
    // A converted request: the client used apps/v1beta1, the object is apps/v1.
    let mut req = request("deployment-create.json");
    req.request_resource = Some(GroupVersionResource::new("apps", "v1beta1", "deployments"));
    assert_eq!(
        builtin_images(&req)["containers"],
        vec!["registry.example.com/team/api:1.0"]
    );
    // Unknown GVR entirely: nothing, even though the object has a pod template.
    req.resource = GroupVersionResource::new("apps", "v1beta2", "deployments");
    assert!(builtin_images(&req).is_empty());
    // Known GVR with no object at all: keys present, lists empty.
    let mut empty = request("pod-create.json");
    empty.object = None;
    assert_eq!(builtin_images(&empty), map(&[], &[], &[]));
}

fn pointers(file: &str) -> Vec<(String, String)> {
    let req = request(file);
    let object = req.object.unwrap();
    let kind = object.kind().unwrap().to_owned();
    image_pointers(&object, &kind)
        .into_iter()
        .map(|at| (at.pointer, at.image))
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(p, i)| ((*p).to_owned(), (*i).to_owned()))
        .collect()
}

#[test]
fn image_pointers_per_kind() {
    let tool = format!("ghcr.io/org/tool@{DIG}");
    let t = "/spec/template/spec";
    let cases: Vec<(&str, Vec<(String, String)>)> = vec![
        (
            "pod-create.json",
            pairs(&[
                ("/spec/initContainers/0/image", "busybox:1.36"),
                ("/spec/containers/0/image", "nginx"),
                (
                    "/spec/containers/1/image",
                    "ghcr.io/kyverno/test-verify-image:signed",
                ),
                ("/spec/containers/2/image", &tool),
            ]),
        ),
        (
            "pod-ephemeralcontainers.json",
            pairs(&[
                ("/spec/initContainers/0/image", "busybox:1.36"),
                ("/spec/containers/0/image", "nginx"),
                (
                    "/spec/containers/1/image",
                    "ghcr.io/kyverno/test-verify-image:signed",
                ),
                ("/spec/containers/2/image", &tool),
                ("/spec/ephemeralContainers/0/image", "busybox:debug"),
            ]),
        ),
        (
            "deployment-create.json",
            pairs(&[
                (&format!("{t}/initContainers/0/image"), "alpine:3.20"),
                (
                    &format!("{t}/containers/0/image"),
                    "registry.example.com/team/api:1.0",
                ),
            ]),
        ),
        (
            "statefulset-create.json",
            pairs(&[
                (
                    &format!("{t}/initContainers/0/image"),
                    "registry.example.com/team/migrate:2",
                ),
                (&format!("{t}/containers/0/image"), "postgres:16"),
            ]),
        ),
        (
            "daemonset-create.json",
            pairs(&[(
                &format!("{t}/containers/0/image"),
                "quay.io/prometheus/node-exporter:v1.8.0",
            )]),
        ),
        (
            "replicaset-create.json",
            pairs(&[(
                &format!("{t}/containers/0/image"),
                "registry.example.com/team/api:1.0",
            )]),
        ),
        (
            "job-create.json",
            pairs(&[
                (&format!("{t}/initContainers/0/image"), "busybox"),
                (
                    &format!("{t}/containers/0/image"),
                    "registry.example.com/team/migrate:2",
                ),
            ]),
        ),
        (
            "replicationcontroller-create.json",
            pairs(&[(&format!("{t}/containers/0/image"), "httpd:2.4")]),
        ),
        (
            "cronjob-create.json",
            pairs(&[
                (
                    "/spec/jobTemplate/spec/template/spec/initContainers/0/image",
                    "alpine",
                ),
                (
                    "/spec/jobTemplate/spec/template/spec/containers/0/image",
                    "registry.example.com/team/report:3",
                ),
            ]),
        ),
        ("namespace-create.json", vec![]),
        ("configmap-create.json", vec![]),
    ];
    for (file, want) in cases {
        assert_eq!(pointers(file), want, "{file}");
    }
}

#[test]
fn image_pointers_skip_containers_without_image() {
    let pod: AdmittedObject = json!({"kind": "Pod", "spec": {"containers": [
        {"name": "a"}, {"name": "b", "image": 3}, {"name": "c", "image": "nginx"}
    ], "initContainers": "not-a-list"}})
    .into();
    let got = image_pointers(&pod, "Pod");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].pointer, "/spec/containers/2/image");
    assert_eq!(got[0].field, "containers");
    assert!(image_pointers(&pod, "Service").is_empty());
}

#[test]
fn pointer_tokens_are_escaped() {
    assert_eq!(escape_pointer_token("a/b~c"), "a~1b~0c");
    assert_eq!(escape_pointer_token("containers"), "containers");
}

fn policy_with(matchers: Vec<ImageMatcher>) -> ivory_policy::compiled::CompiledPolicy {
    let mut p = policy("p", vec![pod_rule()]);
    p.image_matchers = matchers;
    p
}

#[test]
fn match_image_references() {
    let expr = |e: &str| ImageMatcher::Expression(cel(e, &["ref"]));
    let signed = "ghcr.io/kyverno/test-verify-image:signed";
    let cases: Vec<(&str, Vec<ImageMatcher>, &str, bool)> = vec![
        ("empty matches all", vec![], "nginx", true),
        (
            "glob crosses slashes",
            vec![glob("ghcr.io/*")],
            signed,
            true,
        ),
        (
            "glob miss",
            vec![glob("ghcr.io/*")],
            "docker.io/nginx:latest",
            false,
        ),
        // Stricter than Kyverno on purpose: a bare name is also matched as `docker.io/library/…`.
        (
            "bare name matches its canonical host",
            vec![glob("docker.io/*")],
            "nginx",
            true,
        ),
        (
            "normalized",
            vec![glob("docker.io/*")],
            "docker.io/nginx:latest",
            true,
        ),
        (
            "OR across entries",
            vec![glob("quay.io/*"), glob("ghcr.io/*")],
            signed,
            true,
        ),
        (
            "expression",
            vec![expr("ref.startsWith('ghcr.io/')")],
            signed,
            true,
        ),
        (
            "expression miss",
            vec![expr("ref.startsWith('ghcr.io/')")],
            "nginx",
            false,
        ),
        (
            "glob then expression",
            vec![glob("quay.io/*"), expr("ref == 'nginx'")],
            "nginx",
            true,
        ),
        // The first match wins before a later entry could error.
        (
            "short circuit",
            vec![glob("*"), expr("ref.nothere == 1")],
            "nginx",
            true,
        ),
    ];
    for (name, matchers, image, want) in cases {
        assert_eq!(
            matches_image(&policy_with(matchers), image).unwrap(),
            want,
            "{name}"
        );
    }
    let err = matches_image(
        &policy_with(vec![glob("quay.io/*"), expr("ref.nothere == 1")]),
        "nginx",
    )
    .unwrap_err();
    match err {
        MatchError::ImageReference { index, image, .. } => {
            assert_eq!(index, 1);
            assert_eq!(image, "nginx");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn filter_images_keeps_every_key() {
    let p = policy_with(vec![glob("ghcr.io/*")]);
    let images = builtin_images(&request("pod-create.json"));
    let got = filter_images(&p, &images).unwrap();
    assert_eq!(
        got,
        map(
            &[],
            &[
                "ghcr.io/kyverno/test-verify-image:signed",
                &format!("ghcr.io/org/tool@{DIG}")
            ],
            &[]
        )
    );
}

/// Every spelling the kubelet pulls identically is selected by a glob naming the canonical
/// host, both by globs and by CEL expressions over `ref`.
#[test]
fn spellings_of_one_image_are_all_matched() {
    let cases: [(&str, String); 9] = [
        ("localhost:5000/*", format!("LOCALHOST:5000/app@{DIG}")),
        ("localhost:5000/*", format!("localhost:05000/app@{DIG}")),
        ("ghcr.io/acme/*", format!("ghcr.io:443/acme/app@{DIG}")),
        ("ghcr.io/acme/*", "GHCR.IO/acme/app:v1".to_owned()),
        ("docker.io/*", format!("busybox@{DIG}")),
        ("docker.io/*", format!("library/busybox@{DIG}")),
        (
            "docker.io/*",
            format!("index.docker.io/library/busybox@{DIG}"),
        ),
        (
            "docker.io/*",
            format!("registry-1.docker.io/library/busybox@{DIG}"),
        ),
        ("docker.io/library/busybox:*", "busybox".to_owned()),
    ];
    for (pattern, image) in &cases {
        let by_glob = policy_with(vec![glob(pattern)]);
        assert!(matches_image(&by_glob, image).unwrap(), "{pattern} {image}");
        let prefix = pattern.trim_end_matches('*');
        let by_expr = policy_with(vec![ImageMatcher::Expression(cel(
            &format!("ref.startsWith('{prefix}')"),
            &["ref"],
        ))]);
        assert!(
            matches_image(&by_expr, image).unwrap(),
            "expr {prefix} {image}"
        );
    }
    let other = policy_with(vec![glob("ghcr.io/acme/*")]);
    for image in [
        "ghcr.io/acmex/app",
        "ghcr.io:5000/acme/app",
        "evil.io/ghcr.io/acme/app",
    ] {
        assert!(!matches_image(&other, image).unwrap(), "{image}");
    }
    // The images map keeps the string as written; only the selection uses the spellings.
    let mut images = BTreeMap::new();
    images.insert("containers".to_owned(), vec![cases[3].1.clone()]);
    assert_eq!(filter_images(&other, &images).unwrap(), images);
}

#[test]
fn selection_of_hosts_and_repositories() {
    let on_ghcr = policy_with(vec![glob("ghcr.io/acme/*")]);
    assert!(may_select_on_host(&on_ghcr, "ghcr.io"));
    assert!(!may_select_on_host(&on_ghcr, "quay.io"));
    assert!(selects_repository(&on_ghcr, "ghcr.io/acme/app"));
    assert!(!selects_repository(&on_ghcr, "ghcr.io/other/app"));
    // A glob whose literal start is the host alone may select on it.
    assert!(may_select_on_host(
        &policy_with(vec![glob("ghcr*")]),
        "ghcr.io"
    ));
    // No matcher, or an expression: any host.
    assert!(may_select_on_host(&policy_with(vec![]), "quay.io"));
    let expr = ImageMatcher::Expression(cel("ref.startsWith('ghcr.io/')", &["ref"]));
    assert!(may_select_on_host(&policy_with(vec![expr]), "quay.io"));
}

//! Every shipped policy file loads: Kyverno's documented examples, ivory's samples and the
//! embedded default; Kyverno libraries ivory lacks fail with a clear message.

use std::path::{Path, PathBuf};

use ivory_policy::types::PolicyKind;
use ivory_policy::{CompiledPolicy, LoadReport, load_path};

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn assert_clean(report: &LoadReport) {
    let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

fn find<'a>(report: &'a LoadReport, name: &str) -> &'a CompiledPolicy {
    report
        .policies
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("policy {name} not loaded"))
}

/// Kyverno's documented credentials example names cloud credential helpers ivory does not have:
/// refused at load, naming each field, rather than loaded and read without them.
#[test]
fn kyverno_credentials_example_is_refused_for_its_providers() {
    let report = load_path(repo_path("tests/data/kyverno-refused"));
    assert!(report.policies.is_empty());
    let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 4, "{errors:#?}");
    for (i, provider) in ["google", "azure", "amazon", "github"].iter().enumerate() {
        let want = format!(
            "spec.credentials.providers[{}]: Forbidden: \"{provider}\" is not supported: use pull secrets (spec.credentials.secrets)",
            i + 1
        );
        assert!(
            errors.iter().any(|e| e.ends_with(&want)),
            "{want} not in {errors:#?}"
        );
    }
}

#[test]
fn kyverno_examples_load_unchanged() {
    let report = load_path(repo_path("tests/data/kyverno"));
    assert_clean(&report);
    assert!(report.skipped.is_empty());
    let mut names: Vec<&str> = report.policies.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "ivpol-autogen-deployments-cronjobs",
            "ivpol-cli-sample",
            "ivpol-cosign-attestation-extract-cache",
            "ivpol-ephemeral",
            "ivpol-match-expression",
            "ivpol-mutate-digest",
            "ivpol-report-admission",
            "ivpol-sample",
            "nivpol-deny",
            "verify-image-ivpol",
        ]
    );

    // (a) notary + referrer: loads; verification of notary is a runtime concern.
    let a = find(&report, "ivpol-sample");
    assert_eq!(a.timeout_seconds(), Some(20));
    assert!(a.attestors[0].attestor.notary.is_some());
    assert_eq!(a.validations.len(), 3);
    assert_eq!(a.autogen.len(), 2);
    // (d) keyless + SLSA; note the CRD's `insecureIgnoreSCT` spelling.
    let d = find(&report, "ivpol-cosign-attestation-extract-cache");
    let cosign = d.attestors[0].attestor.cosign.as_ref().unwrap();
    let ctlog = cosign.ctlog.as_ref().unwrap();
    assert_eq!(ctlog.insecure_ignore_sct, Some(true));
    assert_eq!(ctlog.url.as_deref(), Some("https://rekor.sigstore.dev"));
    assert_eq!(cosign.keyless.as_ref().unwrap().identities.len(), 1);
    assert_eq!(
        d.attestations[0].intoto.as_ref().unwrap().type_,
        "https://slsa.dev/provenance/v1"
    );
    // (e) digest pinning only, `ghcr.io/**` glob.
    let e = find(&report, "ivpol-mutate-digest");
    assert!(e.mutate_digest && !e.verify_digest && !e.required && e.attestors.is_empty());
    // (f) JSON mode without matchConstraints, custom extractor.
    let f = find(&report, "ivpol-cli-sample");
    assert!(f.json_mode);
    assert_eq!(f.image_extractors[0].name, "bar");
    assert!(f.autogen.is_empty());
    // (g) autogen restricted to deployments and cronjobs.
    let g = find(&report, "ivpol-autogen-deployments-cronjobs");
    let rules = ivory_policy::autogen_rules(g);
    let resources: Vec<&str> = rules
        .iter()
        .flat_map(|r| r.resources.iter().map(String::as_str))
        .collect();
    assert_eq!(resources, ["deployments", "cronjobs"]);
    assert_eq!(
        g.autogen[1].match_conditions[0].program.source(),
        "has(object.spec.jobTemplate.spec.template.metadata.labels) && has(object.spec.jobTemplate.spec.template.metadata.labels.prod) && object.spec.jobTemplate.spec.template.metadata.labels.prod == 'true'"
    );
    // (i) listing pods/ephemeralcontainers keeps autogen (Kyverno #17427; it disabled it
    // before); (l) deployments policy is not autogen'd.
    assert_eq!(find(&report, "ivpol-ephemeral").autogen.len(), 2);
    assert!(find(&report, "ivpol-report-admission").autogen.is_empty());
    // (j) namespaced.
    let j = find(&report, "nivpol-deny");
    assert_eq!(j.kind, PolicyKind::NamespacedImageValidatingPolicy);
    assert_eq!(j.namespace.as_deref(), Some("test-ns"));
}

#[test]
fn kyverno_library_examples_load_with_what_they_read_from_the_cluster() {
    let dir = repo_path("tests/data/kyverno-library");
    let report = load_path(&dir);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let names: Vec<&str> = report.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["ivpol-notary-configmap-cert", "ivpol-image-data-arch"]
    );
    // (b) reads ConfigMaps of the request's namespace: watched in every namespace.
    let reads: Vec<String> = report.policies[0]
        .cluster_reads
        .resources
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(reads, ["v1 configmaps in all namespaces"]);
    // (o) `image.GetMetadata` is provided by ivory-cel.
    assert!(report.policies[1].cluster_reads.is_empty());
    assert!(
        report.policies[1].variables[1]
            .program
            .calls_function("image.GetMetadata")
    );
}

#[test]
fn samples_load() {
    let report = load_path(repo_path("../../policies/samples"));
    assert_clean(&report);
    assert!(report.policies.len() >= 6, "{}", report.policies.len());
}

#[test]
fn default_policy_file_matches_embedded() {
    let report = load_path(repo_path("../../policies/default.yaml"));
    assert_clean(&report);
    let embedded = ivory_policy::default_policy();
    assert_eq!(report.policies[0].hash, embedded.hash);
    assert_eq!(embedded.origin.file, None);
}

/// The shipped policies list `pods/ephemeralcontainers` (so Kyverno registers `kubectl debug`
/// too), keep their autogen variants, and verify every image a pod runs.
#[test]
fn shipped_policies_cover_every_image_of_a_pod() {
    let mut policies = load_path(repo_path("../../policies/samples")).policies;
    policies.push(ivory_policy::default_policy());
    for p in &policies {
        // The compiled rules: `pods/ephemeralcontainers` is added wherever `pods` is named,
        // so a rule on anything but pods fails here.
        let rules = &p.match_constraints.resource_rules;
        assert!(
            rules
                .iter()
                .all(|r| r.resources.iter().any(|x| x == "pods/ephemeralcontainers")),
            "{}",
            p.name
        );
        assert!(!p.autogen.is_empty(), "{} lost autogen", p.name);
        for v in p
            .validations
            .iter()
            .filter(|v| v.expression.source().contains("images."))
        {
            let source = v.expression.source();
            for key in [
                "containers",
                "initContainers",
                "ephemeralContainers",
                "imageVolumes",
            ] {
                assert!(source.contains(key), "{}: {key} not verified", p.name);
            }
        }
    }
}

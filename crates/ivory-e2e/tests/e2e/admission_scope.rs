//! Admission scope against a real kube-apiserver, through webhooks registered from
//! `ivory webhooks` and the real registry:
//!
//! * a policy with a `namespaceSelector` applies in a namespace created just before the Pod,
//!   with `ivory serve --kube` (the Namespace is read from the API when the reflector has not
//!   seen it yet) and in file mode (the generated webhook carries the selector, ivory trusts
//!   the API server's choice to call);
//! * a NamespacedImageValidatingPolicy cannot use a pull Secret of ivory's namespace (confused
//!   deputy): the Pod is denied naming the Secret it looked for; the Secret of its own namespace
//!   works;
//! * ivory's annotations (`ivory.dev/verify-platforms`, `ivory.dev/notation-trust-policy`) reach
//!   `ivory serve --kube` through Kyverno's CRD.

use std::ffi::OsStr;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use ivory_e2e::{eventually, unique_name};
use ivory_testkit::policy::PodPolicy;
use ivory_testkit::{HarnessOptions, RegistryHarness};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::setup::{
    POLICY_CRDS, PROPAGATION, apply_policy, cluster_with_crds, ivory_dir, namespace, push,
    register, serve, serve_policies, unregister, workspace,
};

const SELECT_LABEL: &str = "ivory-e2e/select";
const AUTH_USER: &str = "e2e";
const AUTH_PASSWORD: &str = "e2e-secret-password";

/// The API server's answer to a Pod CREATE: (status, body).
async fn create_pod(client: &Client, ns: &str, image: &str, dry_run: bool) -> Result<(u16, Value)> {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": unique_name("pod")},
        "spec": {"containers": [{"name": "app", "image": image}]}
    });
    let mut uri = format!("/api/v1/namespaces/{ns}/pods");
    if dry_run {
        uri.push_str("?dryRun=All");
    }
    let request = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(&pod)?))?;
    let response = client.send(request).await?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect_bytes().await?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

fn image_of(body: &Value) -> &str {
    body.pointer("/spec/containers/0/image")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Pins images of `host` to their digest, in namespaces labelled `SELECT_LABEL=<value>`.
fn selected_pin_policy(name: &str, host: &str, value: &str) -> String {
    selected(PodPolicy::new(name), host, value)
        .spec(
            "  failurePolicy: Fail
  validationConfigurations:
    verifyDigest: false
    required: false
  attestors: []
  validations:
    - expression: \"true\"
",
        )
        .yaml()
}

/// `policy` for Pod CREATEs of images of `host` in namespaces labelled `SELECT_LABEL=<value>`.
fn selected(policy: PodPolicy, host: &str, value: &str) -> PodPolicy {
    policy
        .operations("CREATE")
        .namespace_selector(&format!(
            "      matchLabels:\n        {SELECT_LABEL}: {value}\n"
        ))
        .glob(&format!("{host}/*"))
}

/// Creates a namespace with the selected label and, at once, a Pod in it: the Pod must come
/// back pinned. `rounds` times, each in a fresh namespace.
async fn pinned_in_fresh_namespaces(
    client: &Client,
    value: &str,
    image: &str,
    pinned: &str,
    rounds: usize,
) -> Result<()> {
    for round in 0..rounds {
        let ns = namespace(client, "e2e-fresh", &[(SELECT_LABEL, value)]).await?;
        let (status, body) = create_pod(client, &ns, image, false).await?;
        ensure!(
            status == 201 && image_of(&body) == pinned,
            "round {round}: a pod in the new namespace {ns} was not pinned: {status} {body}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_selector_policies_apply_to_namespaces_ivory_has_not_seen() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&POLICY_CRDS).await?;
    let registry = RegistryHarness::start_default().await?;
    let (image, digest) = push(&registry, "unsigned").await?;
    let pinned = format!("{image}@{digest}");
    let (dir, ca, registry_ca) = ivory_dir(&registry)?;
    let own_ns = namespace(&client, "e2e-ivory", &[]).await?;
    let value = unique_name("sel");
    let policy_name = unique_name("e2e-select-pin");
    let yaml = selected_pin_policy(&policy_name, registry.host(), &value);
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies)?;
    std::fs::write(policies.join("select.yaml"), &yaml)?;
    apply_policy(&client, &yaml).await?;
    let control = namespace(&client, "e2e-unselected", &[]).await?;

    // ivory serve --kube.
    let kubeconfig = cluster.kubeconfig().as_os_str().to_owned();
    let envs = [
        ("KUBECONFIG", kubeconfig.as_os_str()),
        ("POD_NAMESPACE", OsStr::new(&own_ns)),
    ];
    let ivory = serve(dir.path(), &registry_ca, &[OsStr::new("--kube")], &envs).await?;
    let hooks = register(&client, &policies, &ivory, &ca, &unique_name("kube")).await?;
    let hook = &hooks;
    let first = eventually("the selector policy to pin pods", PROPAGATION, || async {
        pinned_in_fresh_namespaces(&client, &value, &image, &pinned, 1).await
    })
    .await;
    if let Err(e) = first {
        bail!("{e}\nwebhooks {hook:?}\nivory log:\n{}", ivory.logs());
    }
    pinned_in_fresh_namespaces(&client, &value, &image, &pinned, 5)
        .await
        .with_context(|| format!("ivory --kube log:\n{}", ivory.logs()))?;
    let (status, body) = create_pod(&client, &control, &image, true).await?;
    ensure!(
        status == 201 && image_of(&body) == image,
        "outside the selector: {status} {body}"
    );
    // Whether the watch or the API read answered depends on timing; both must pin.
    let read = ivory.logs().matches("read from the API").count();
    eprintln!("namespaces read from the API instead of the watch: {read} of 6+");
    unregister(&client, &hooks).await?;
    drop(ivory);

    // File mode: no Namespace labels at all; the webhook's selector is trusted.
    let policy_file = policies.join("select.yaml");
    let ivory = serve_policies(dir.path(), &registry_ca, &policy_file).await?;
    let hooks = register(&client, &policies, &ivory, &ca, &unique_name("file")).await?;
    let first = eventually("file mode to pin pods", PROPAGATION, || async {
        pinned_in_fresh_namespaces(&client, &value, &image, &pinned, 1).await
    })
    .await;
    if let Err(e) = first {
        bail!("{e}\nivory log:\n{}", ivory.logs());
    }
    pinned_in_fresh_namespaces(&client, &value, &image, &pinned, 2).await?;
    let (status, body) = create_pod(&client, &control, &image, true).await?;
    ensure!(
        status == 201 && image_of(&body) == image,
        "outside the selector: {status} {body}"
    );
    unregister(&client, &hooks).await?;
    Ok(())
}

/// A `kubernetes.io/dockerconfigjson` Secret for `host` with the test login.
fn pull_secret(name: &str, host: &str) -> Result<Secret> {
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    let config = json!({"auths": {host: {"auth": b64(&format!("{AUTH_USER}:{AUTH_PASSWORD}"))}}});
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": b64(&config.to_string())}
    }))?)
}

/// A namespaced digest-pinning policy for `host` reading the registry with `secret`.
fn namespaced_pin_policy(name: &str, ns: &str, host: &str, secret: &str) -> String {
    format!(
        "apiVersion: policies.kyverno.io/v1
kind: NamespacedImageValidatingPolicy
metadata:
  name: {name}
  namespace: {ns}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [\"\"]
        apiVersions: [v1]
        operations: [CREATE]
        resources: [pods]
  matchImageReferences:
    - glob: \"{host}/*\"
  validationConfigurations:
    verifyDigest: false
    required: false
  credentials:
    secrets: [{secret}]
  attestors: []
  validations:
    - expression: \"true\"
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_policy_cannot_use_ivorys_pull_secret() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&POLICY_CRDS).await?;
    let registry = RegistryHarness::start(HarnessOptions::basic(AUTH_USER, AUTH_PASSWORD)).await?;
    let (image, digest) = push(&registry, "unsigned").await?;
    let pinned = format!("{image}@{digest}");
    let (dir, ca, registry_ca) = ivory_dir(&registry)?;

    // Two working Secrets: one in ivory's namespace, one in the team's.
    let own_ns = namespace(&client, "e2e-ivory", &[]).await?;
    let team = namespace(&client, "e2e-team", &[]).await?;
    let secrets = |ns: &str| Api::<Secret>::namespaced(client.clone(), ns);
    let params = PostParams::default();
    secrets(&own_ns)
        .create(&params, &pull_secret("ivory-pull", registry.host())?)
        .await?;
    secrets(&team)
        .create(&params, &pull_secret("team-pull", registry.host())?)
        .await?;

    let kubeconfig = cluster.kubeconfig().as_os_str().to_owned();
    let envs = [
        ("KUBECONFIG", kubeconfig.as_os_str()),
        ("POD_NAMESPACE", OsStr::new(&own_ns)),
    ];
    let ivory = serve(dir.path(), &registry_ca, &[OsStr::new("--kube")], &envs).await?;
    let name = "borrow";
    let borrowing = namespaced_pin_policy(name, &team, registry.host(), "ivory-pull");
    apply_policy(&client, &borrowing).await?;
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies)?;
    std::fs::write(policies.join("borrow.yaml"), &borrowing)?;
    let hooks = register(&client, &policies, &ivory, &ca, &unique_name("creds")).await?;

    // ivory's own Secret is out of the namespaced policy's reach: the Pod is refused, naming
    // the Secret the policy may read.
    let expected = format!(
        "spec.credentials.secrets[0] \"{team}/ivory-pull\": Secret {team}/ivory-pull of type \
         kubernetes.io/dockerconfigjson not found; a NamespacedImageValidatingPolicy reads \
         Secrets of its own namespace only"
    );
    let denied = eventually(
        "the borrowing policy to be refused",
        PROPAGATION,
        || async {
            let (status, body) = create_pod(&client, &team, &image, true).await?;
            let message = body["message"].as_str().unwrap_or("");
            if status == 403 && message.contains(&expected) {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{status} {body}"))
            }
        },
    )
    .await;
    if let Err(e) = denied {
        bail!("{e}\nivory log:\n{}", ivory.logs());
    }

    // The Secret of its own namespace works.
    let own = namespaced_pin_policy(name, &team, registry.host(), "team-pull");
    apply_policy(&client, &own).await?;
    let pinned_now = eventually("the team Secret to pin pods", PROPAGATION, || async {
        let (status, body) = create_pod(&client, &team, &image, true).await?;
        if status == 201 && image_of(&body) == pinned {
            Ok(())
        } else {
            Err(anyhow::anyhow!("{status} {body}"))
        }
    })
    .await;
    if let Err(e) = pinned_now {
        bail!("{e}\nivory log:\n{}", ivory.logs());
    }

    // Naming ivory's namespace outright is a policy error, not a credential.
    let qualified = namespaced_pin_policy(
        "borrow-qualified",
        &team,
        registry.host(),
        &format!("{own_ns}/ivory-pull"),
    );
    apply_policy(&client, &qualified).await?;
    let rejected = eventually(
        "the qualified policy to be rejected",
        PROPAGATION,
        || async {
            let logs = ivory.logs();
            if logs.contains("may only use Secrets of its own namespace") {
                Ok(())
            } else {
                Err(anyhow::anyhow!("not rejected yet"))
            }
        },
    )
    .await;
    if let Err(e) = rejected {
        bail!("{e}\nivory log:\n{}", ivory.logs());
    }
    unregister(&client, &hooks).await?;
    Ok(())
}

/// A policy on Pods in namespaces labelled `SELECT_LABEL=<value>` requiring the signature of
/// `attestor`, with `ivory.dev/verify-platforms: <platforms>` when given.
fn platforms_policy(
    name: &str,
    host: &str,
    value: &str,
    platforms: Option<&str>,
    attestor: &str,
) -> String {
    let policy = match platforms {
        Some(p) => PodPolicy::new(name).annotation("ivory.dev/verify-platforms", p),
        None => PodPolicy::new(name),
    };
    selected(policy, host, value)
        .spec(&format!(
            "  failurePolicy: Fail
{attestor}  validations:
    - expression: >-
        images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)
      message: failed the image Signature verification
"
        ))
        .yaml()
}

/// ivory's multi-platform choice travels through the real API server: Kyverno's CRD prunes
/// `spec` fields it does not declare, never annotations, so `ivory.dev/verify-platforms` on a
/// policy applied to the cluster reaches `ivory serve --kube`. An arm64-only image whose
/// platform manifest is signed (its index is not) is admitted under `allPlatforms` and denied
/// once the annotation is removed (Kyverno's default: the index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verify_platforms_annotation_reaches_ivory_through_the_api_server() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&POLICY_CRDS).await?;
    let registry = RegistryHarness::start_default().await?;
    let signer = ivory_testkit::CosignSigner::generate()?;
    let repo = "ivory/arm-only";
    let (_, children) = registry
        .push_platform_index(repo, "v1", &[("linux", "arm64")])
        .await?;
    let child = children.first().context("no platform manifest")?;
    registry.push_cosign_signature(repo, child, &signer).await?;
    let image = format!("{}/{repo}:v1", registry.host());
    let (dir, ca, registry_ca) = ivory_dir(&registry)?;
    let own_ns = namespace(&client, "e2e-ivory", &[]).await?;
    let value = unique_name("plat");
    let ns = namespace(&client, "e2e-platforms", &[(SELECT_LABEL, &value)]).await?;
    let name = unique_name("e2e-platforms");
    let attestor = ivory_testkit::policy::key_attestor_yaml(&signer.public_pem);
    let all = platforms_policy(
        &name,
        registry.host(),
        &value,
        Some("allPlatforms"),
        &attestor,
    );
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies)?;
    std::fs::write(policies.join("platforms.yaml"), &all)?;
    apply_policy(&client, &all).await?;

    let kubeconfig = cluster.kubeconfig().as_os_str().to_owned();
    let envs = [
        ("KUBECONFIG", kubeconfig.as_os_str()),
        ("POD_NAMESPACE", OsStr::new(&own_ns)),
    ];
    let ivory = serve(dir.path(), &registry_ca, &[OsStr::new("--kube")], &envs).await?;
    let hooks = register(&client, &policies, &ivory, &ca, &unique_name("platforms")).await?;
    let admitted = eventually(
        "allPlatforms to admit the arm64-only image",
        PROPAGATION,
        || async {
            let (status, body) = create_pod(&client, &ns, &image, true).await?;
            ensure!(status == 201, "{status} {body}");
            Ok(())
        },
    )
    .await;
    if let Err(e) = admitted {
        bail!("{e}\nivory --kube log:\n{}", ivory.logs());
    }

    // Without the annotation: Kyverno's default, the index's own signature, which it lacks.
    let index = platforms_policy(&name, registry.host(), &value, None, &attestor);
    apply_policy(&client, &index).await?;
    let denied = eventually("the index default to deny it", PROPAGATION, || async {
        let (status, body) = create_pod(&client, &ns, &image, true).await?;
        let message = body["message"].as_str().unwrap_or_default();
        ensure!(
            status == 403 && message.contains("failed the image Signature verification"),
            "{status} {body}"
        );
        Ok(())
    })
    .await;
    if let Err(e) = denied {
        bail!("{e}\nivory --kube log:\n{}", ivory.logs());
    }
    unregister(&client, &hooks).await?;
    Ok(())
}

/// A policy whose `notary` attestor trusts the Notation fixtures' root, with ivory's Notation
/// trust policy `trust` (none: Kyverno's strict level).
fn notation_policy(name: &str, host: &str, value: &str, trust: Option<&str>) -> Result<String> {
    let root = std::fs::read_to_string(workspace().join("fixtures/notation/pki/root.pem"))?;
    let policy = match trust {
        Some(t) => {
            PodPolicy::new(name).annotation("ivory.dev/notation-trust-policy", &format!("'{t}'"))
        }
        None => PodPolicy::new(name),
    };
    let certs: String = root.lines().map(|l| format!("            {l}\n")).collect();
    Ok(selected(policy, host, value)
        .spec(&format!(
            "  failurePolicy: Fail
  attestors:
    - name: notary
      notary:
        certs:
          value: |-
{certs}  validations:
    - expression: >-
        images.containers.map(image, verifyImageSignatures(image, [attestors.notary])).all(e, e > 0)
      message: failed to verify image with notary cert
"
        ))
        .yaml())
}

/// A Kyverno policy with a `notary` attestor goes through Kyverno's CRD, and ivory's Notation
/// trust policy (an annotation) reaches `ivory serve --kube`: an image signed by the real
/// notation CLI with a certificate that has since expired is admitted under `permissive` and
/// denied once the annotation is removed (Kyverno's strict level).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notation_trust_policy_annotation_reaches_ivory_through_the_api_server() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&POLICY_CRDS).await?;
    let registry = RegistryHarness::start_default().await?;
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(
        workspace().join("fixtures/notation/manifest.json"),
    )?)?;
    let row = &manifest["images"]["expired"];
    let repo = row["repo"].as_str().context("repo")?;
    registry
        .push_oci_layout(&workspace().join("fixtures/notation/oci").join(repo), repo)
        .await?;
    let image = format!(
        "{}/{repo}@{}",
        registry.host(),
        row["digest"].as_str().context("digest")?
    );
    let (dir, ca, registry_ca) = ivory_dir(&registry)?;
    let own_ns = namespace(&client, "e2e-ivory", &[]).await?;
    let value = unique_name("notation");
    let ns = namespace(&client, "e2e-notation", &[(SELECT_LABEL, &value)]).await?;
    let name = unique_name("e2e-notation");
    let permissive = notation_policy(
        &name,
        registry.host(),
        &value,
        Some(r#"{"notary": {"level": "permissive"}}"#),
    )?;
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies)?;
    std::fs::write(policies.join("notation.yaml"), &permissive)?;
    apply_policy(&client, &permissive).await?;

    let kubeconfig = cluster.kubeconfig().as_os_str().to_owned();
    let envs = [
        ("KUBECONFIG", kubeconfig.as_os_str()),
        ("POD_NAMESPACE", OsStr::new(&own_ns)),
    ];
    let ivory = serve(dir.path(), &registry_ca, &[OsStr::new("--kube")], &envs).await?;
    let hooks = register(&client, &policies, &ivory, &ca, &unique_name("notation")).await?;
    let admitted = eventually(
        "permissive to admit the expired signer's image",
        PROPAGATION,
        || async {
            let (status, body) = create_pod(&client, &ns, &image, true).await?;
            ensure!(status == 201, "{status} {body}");
            Ok(())
        },
    )
    .await;
    if let Err(e) = admitted {
        bail!("{e}\nivory --kube log:\n{}", ivory.logs());
    }

    // Without the annotation: Kyverno's strict level, which the expired certificate fails.
    let strict = notation_policy(&name, registry.host(), &value, None)?;
    apply_policy(&client, &strict).await?;
    let denied = eventually("strict to deny it", PROPAGATION, || async {
        let (status, body) = create_pod(&client, &ns, &image, true).await?;
        let message = body["message"].as_str().unwrap_or_default();
        ensure!(
            status == 403 && message.contains("failed to verify image with notary cert"),
            "{status} {body}"
        );
        Ok(())
    })
    .await;
    if let Err(e) = denied {
        bail!("{e}\nivory --kube log:\n{}", ivory.logs());
    }
    unregister(&client, &hooks).await?;
    Ok(())
}

//! Mutation GitOps tools can live with (ivory's `ivory.dev/digest-pinning` policy annotation and
//! Namespace label), on a real kube-apiserver with `ivory serve --kube`, webhooks from
//! `ivory webhooks` and the real registry. A Deployment is applied twice with server-side apply
//! (the field manager a GitOps controller uses), then a Pod is created from its stored template
//! as the ReplicaSet controller would (the test cluster has no controller-manager):
//!
//! * default (Kyverno's behaviour): the template is pinned, so the live object differs from
//!   what was applied (drift), and the Pod is pinned;
//! * `pods-only` (policy annotation, or the Namespace label under a default policy): the
//!   template stays exactly as applied, the second apply changes nothing, the Pod is pinned;
//! * `no-patch` (policy annotation, or the Namespace label under a policy that allows it with
//!   `ivory.dev/namespace-digest-pinning: any`): neither is patched, yet an unsigned image is
//!   still denied (Deployment and Pod) and a signed one admitted: the validating stage verifies
//!   the digest the tag names;
//! * the Namespace label `no-patch` under a policy that does not allow it: pinned as by default.

use std::ffi::OsStr;

use anyhow::{Context, Result, bail, ensure};
use ivory_e2e::{eventually, unique_name};
use ivory_testkit::RegistryHarness;
use ivory_testkit::policy::PodPolicy;
use ivory_testkit::review::deployment_object;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};

use crate::setup::{
    IVPOL, POLICY_CRDS, PROPAGATION, apply, cluster_with_crds, dynamic, fixture_key_attestors,
    ivory_dir, namespace, push_signed_and_unsigned, register, serve, unregister,
};

const MESSAGE: &str = "failed the image Signature verification";
/// The field manager of the "GitOps tool" applying the Deployment.
const MANAGER: &str = "e2e-gitops";

/// A pod policy (autogen covers Deployments) verifying every image of `host` in the namespaces
/// `namespaces`, pinning as the annotation `mode` says (`None`: no annotation).
fn policy(name: &str, mode: Option<&str>, host: &str, namespaces: &[&str]) -> Result<String> {
    let policy = match mode {
        // Namespaces may choose no-patch under this policy.
        Some("consent") => {
            PodPolicy::new(name).annotation("ivory.dev/namespace-digest-pinning", "any")
        }
        Some(m) => PodPolicy::new(name).annotation("ivory.dev/digest-pinning", m),
        None => PodPolicy::new(name),
    };
    Ok(policy
        .in_namespace(&namespaces.join(", "))
        .glob(&format!("{host}/*"))
        .spec(&format!(
            "  failurePolicy: Fail
{}  validations:
    - expression: >-
        (images.containers + images.initContainers + images.ephemeralContainers)
          .map(i, verifyImageSignatures(i, [attestors.key])).all(e, e > 0)
      message: {MESSAGE}
",
            fixture_key_attestors()?
        ))
        .yaml())
}

/// The Deployment as the Git repository holds it.
fn manifest(name: &str, image: &str) -> Value {
    deployment_object(
        name,
        json!({"containers": [{"name": "app", "image": image}]}),
    )
}

/// Server-side apply of `manifest` as the GitOps tool does it.
async fn apply_deployment(client: &Client, ns: &str, manifest: &Value) -> Result<Deployment> {
    let name = manifest["metadata"]["name"]
        .as_str()
        .context("manifest without a name")?;
    Ok(Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(manifest))
        .await?)
}

fn template_image(d: &Deployment) -> Option<String> {
    string_at(d, "/spec/template/spec/containers/0/image")
}

/// The string at JSON `pointer` in `object`.
fn string_at(object: &impl serde::Serialize, pointer: &str) -> Option<String> {
    let value = serde_json::to_value(object).ok()?;
    value.pointer(pointer)?.as_str().map(str::to_owned)
}

/// What the ReplicaSet controller does: a Pod from the template of `d`, with its first
/// container's image replaced by `image` when given.
async fn pod_from(client: &Client, ns: &str, d: &Deployment, image: Option<&str>) -> Result<Pod> {
    let value = serde_json::to_value(d)?;
    let mut spec = value
        .pointer("/spec/template/spec")
        .cloned()
        .context("deployment without a pod template")?;
    if let (Some(image), Some(slot)) = (image, spec.pointer_mut("/containers/0/image")) {
        *slot = json!(image);
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": unique_name(&d.name_any()),
            "labels": value.pointer("/spec/template/metadata/labels").cloned().unwrap_or(Value::Null),
        },
        "spec": spec,
    }))?;
    Ok(Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?)
}

fn pod_image(p: &Pod) -> Option<String> {
    string_at(p, "/spec/containers/0/image")
}

/// A denial by the policy, whatever the API object: the API server's message carries ours.
fn denied(result: Result<impl std::fmt::Debug>) -> Result<()> {
    match result {
        Err(e) if format!("{e:#}").contains(MESSAGE) => Ok(()),
        other => bail!("expected a denial by the policy, got {other:?}"),
    }
}

/// One namespace and the mode it should show.
struct Case {
    what: &'static str,
    ns: String,
    /// The template is pinned (Kyverno's behaviour).
    pins_template: bool,
    /// The Pod is pinned.
    pins_pod: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_modes_on_a_deployment_applied_twice_server_side() -> Result<()> {
    let (cluster, client) = cluster_with_crds(&POLICY_CRDS).await?;
    let registry = RegistryHarness::start_default().await?;
    let host = registry.host().to_owned();
    let ((signed, signed_digest), (unsigned, _)) = push_signed_and_unsigned(&registry).await?;
    let pinned = format!("{signed}@{signed_digest}");

    let (dir, ca, registry_ca) = ivory_dir(&registry)?;
    let own_ns = namespace(&client, "e2e-ivory", &[]).await?;
    let default_ns = namespace(&client, "e2e-pin-all", &[]).await?;
    let labelled_ns = namespace(
        &client,
        "e2e-pin-label",
        &[("ivory.dev/digest-pinning", "pods-only")],
    )
    .await?;
    let pods_only_ns = namespace(&client, "e2e-pin-pods", &[]).await?;
    let no_patch_label = [("ivory.dev/digest-pinning", "no-patch")];
    let ignored_ns = namespace(&client, "e2e-pin-ignored", &no_patch_label).await?;
    let chosen_ns = namespace(&client, "e2e-pin-chosen", &no_patch_label).await?;
    let no_patch_ns = namespace(&client, "e2e-pin-none", &[]).await?;

    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies)?;
    let (all_policy, pods_policy, none_policy, consent_policy) = (
        unique_name("e2e-pin-all"),
        unique_name("e2e-pin-pods"),
        unique_name("e2e-pin-none"),
        unique_name("e2e-pin-consent"),
    );
    for (name, mode, namespaces) in [
        (
            &all_policy,
            None,
            vec![
                default_ns.as_str(),
                labelled_ns.as_str(),
                ignored_ns.as_str(),
            ],
        ),
        (&consent_policy, Some("consent"), vec![chosen_ns.as_str()]),
        (&pods_policy, Some("pods-only"), vec![pods_only_ns.as_str()]),
        (&none_policy, Some("no-patch"), vec![no_patch_ns.as_str()]),
    ] {
        let yaml = policy(name, mode, &host, &namespaces)?;
        std::fs::write(policies.join(format!("{name}.yaml")), &yaml)?;
        // The vendored Kyverno CRD stores the annotation as it is.
        apply(&dynamic(&client, IVPOL, None), &yaml).await?;
    }

    let kubeconfig = cluster.kubeconfig().as_os_str().to_owned();
    let envs = [
        ("KUBECONFIG", kubeconfig.as_os_str()),
        ("POD_NAMESPACE", OsStr::new(&own_ns)),
    ];
    let ivory = serve(dir.path(), &registry_ca, &[OsStr::new("--kube")], &envs).await?;
    let logs = || format!("\nivory log:\n{}", ivory.logs());
    let hooks = register(&client, &policies, &ivory, &ca, &unique_name("gitops")).await?;
    // The no-patch policy is never called to mutate; the two others are.
    let (_, mutating) = hooks
        .iter()
        .find(|(kind, _)| kind == "MutatingWebhookConfiguration")
        .context("no mutating webhook configuration")?;
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(mutating)
        .await?;
    let urls: Vec<String> = mutating
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .filter_map(|w| w.client_config.url)
        .collect();
    let named = |policy: &str| urls.iter().any(|u| u.ends_with(&format!("/{policy}")));
    ensure!(
        named(&all_policy) && named(&pods_policy) && named(&consent_policy) && !named(&none_policy),
        "mutating webhooks {urls:?}"
    );

    let cases = [
        Case {
            what: "default",
            ns: default_ns,
            pins_template: true,
            pins_pod: true,
        },
        Case {
            what: "namespace label pods-only",
            ns: labelled_ns,
            pins_template: false,
            pins_pod: true,
        },
        Case {
            what: "policy pods-only",
            ns: pods_only_ns,
            pins_template: false,
            pins_pod: true,
        },
        Case {
            what: "policy no-patch",
            ns: no_patch_ns,
            pins_template: false,
            pins_pod: false,
        },
        Case {
            what: "namespace label no-patch, policy without consent",
            ns: ignored_ns,
            pins_template: true,
            pins_pod: true,
        },
        Case {
            what: "namespace label no-patch, policy with consent",
            ns: chosen_ns,
            pins_template: false,
            pins_pod: false,
        },
    ];
    // Until every webhook is in the API server's chain, an unsigned Pod may be admitted.
    for case in &cases {
        let ready = eventually(
            &format!("{}: unsigned pods to be denied", case.what),
            PROPAGATION,
            || async {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": unique_name("probe")},
                    "spec": {"containers": [{"name": "app", "image": unsigned}]},
                }))?;
                let api = Api::<Pod>::namespaced(client.clone(), &case.ns);
                let result = api
                    .create(
                        &PostParams {
                            dry_run: true,
                            ..PostParams::default()
                        },
                        &pod,
                    )
                    .await
                    .map_err(anyhow::Error::from);
                denied(result)
            },
        )
        .await;
        if let Err(e) = ready {
            bail!("{e}{}", logs());
        }
    }

    for case in &cases {
        let what = case.what;
        let name = unique_name("web");
        let desired = manifest(&name, &signed);
        let first = apply_deployment(&client, &case.ns, &desired)
            .await
            .with_context(|| format!("{what}: first apply{}", logs()))?;
        let live_image = template_image(&first);
        let expected = if case.pins_template { &pinned } else { &signed };
        ensure!(
            live_image.as_deref() == Some(expected.as_str()),
            "{what}: template image {live_image:?}, expected {expected}"
        );
        // The second apply of the same manifest: a GitOps tool's sync.
        let second = apply_deployment(&client, &case.ns, &desired)
            .await
            .with_context(|| format!("{what}: second apply{}", logs()))?;
        ensure!(
            template_image(&second) == live_image,
            "{what}: the second apply changed the template"
        );
        if !case.pins_template {
            // No drift: the live object holds what Git holds, the second apply was a no-op,
            // and the only manager of the object is the GitOps tool.
            ensure!(
                second.resource_version() == first.resource_version(),
                "{what}: the second apply wrote the object ({:?} -> {:?})",
                first.resource_version(),
                second.resource_version()
            );
            let managers: Vec<String> = second
                .managed_fields()
                .iter()
                .filter_map(|m| m.manager.clone())
                .collect();
            ensure!(managers == [MANAGER], "{what}: managers {managers:?}");
        }

        // The Pod the ReplicaSet controller would create from the stored template.
        let pod = pod_from(&client, &case.ns, &second, None)
            .await
            .with_context(|| format!("{what}: pod{}", logs()))?;
        let expected = if case.pins_pod { &pinned } else { &signed };
        ensure!(
            pod_image(&pod).as_deref() == Some(expected.as_str()),
            "{what}: pod image {:?}, expected {expected}",
            pod_image(&pod)
        );

        // Whatever the mode, an unsigned image is denied, in the template and in a Pod.
        denied(
            apply_deployment(&client, &case.ns, &manifest(&unique_name("bad"), &unsigned)).await,
        )
        .with_context(|| format!("{what}: unsigned deployment{}", logs()))?;
        denied(pod_from(&client, &case.ns, &second, Some(&unsigned)).await)
            .with_context(|| format!("{what}: unsigned pod{}", logs()))?;
        eprintln!(
            "{what}: template {:?}, pod {:?}",
            template_image(&second),
            pod_image(&pod)
        );
    }
    unregister(&client, &hooks).await?;
    Ok(())
}

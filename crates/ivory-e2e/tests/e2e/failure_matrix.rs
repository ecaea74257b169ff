//! The webhook failure matrix against a real kube-apiserver: `ivory serve --kube` watching the
//! policy CRDs, a real registry with the signed fixtures, and the webhook configurations from
//! `ivory webhooks`. Every scenario records what was sent, what the API server answered and
//! whether the object was stored into `target/e2e/failure-matrix.md`.
//!
//! A policy that exists is not a webhook that is registered, and a registered webhook is not
//! one that answers: each layer is checked through the API server itself.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ivory_e2e::{FailureMatrix, IvoryServer, Row, eventually, report_path, run_ivory, unique_name};
use ivory_testkit::policy::PodPolicy;
use ivory_testkit::policy::VERIFY_SIGNATURES;
use ivory_testkit::review::{deployment_object, pod_object_with_images};
use ivory_testkit::{Harness, HarnessOptions, HungRegistry, RegistryHarness};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::setup::{
    IVPOL, POLICY_CRDS, PROPAGATION, apply_policy, cluster_with_crds, dynamic,
    fixture_key_attestors, namespace, push, push_signed_and_unsigned, serve, tls,
};

/// `webhookConfiguration.timeoutSeconds` of the test policies.
const WEBHOOK_TIMEOUT_SECS: u64 = 5;
/// The message of the test policies' validation; their `messageExpression` appends the images
/// that failed verification (see [`denial_names`]).
const POLICY_MESSAGE: &str = "failed the image Signature verification";
const TIER_LABEL: &str = "ivory-e2e/tier";
/// Login of the registry that refuses anonymous pulls.
const AUTH_USER: &str = "e2e";
const AUTH_PASSWORD: &str = "e2e-secret-password";
/// The `kubernetes.io/dockerconfigjson` Secret the auth policy names.
const PULL_SECRET: &str = "e2e-regcred";

/// The API server's answer to one request.
#[derive(Debug)]
struct Outcome {
    status: u16,
    body: Value,
    warnings: Vec<String>,
    elapsed: Duration,
}

impl Outcome {
    fn created(&self) -> bool {
        self.status == 201 || self.status == 200
    }

    fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    /// The first container image of a pod, or of a pod template.
    fn first_image(&self) -> &str {
        [
            "/spec/containers/0/image",
            "/spec/template/spec/containers/0/image",
        ]
        .iter()
        .find_map(|p| self.body.pointer(p).and_then(Value::as_str))
        .unwrap_or("")
    }

    fn summary(&self) -> String {
        let mut text = if self.created() {
            format!("{} created, image {}", self.status, self.first_image())
        } else {
            format!("{} {}", self.status, self.message())
        };
        for w in &self.warnings {
            text.push_str(&format!("; warning: {w}"));
        }
        text
    }
}

/// POSTs `object` to `collection` (e.g. `/api/v1/namespaces/ns/pods`) without any client-side
/// interpretation, keeping status, body and `Warning` headers.
async fn create(
    client: &Client,
    collection: &str,
    object: &Value,
    dry_run: bool,
) -> Result<Outcome> {
    let uri = if dry_run {
        format!("{collection}?dryRun=All")
    } else {
        collection.to_owned()
    };
    let request = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(object)?))?;
    let start = ivory_clock::now();
    let response = client.send(request).await?;
    let elapsed = start.elapsed();
    let status = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    let bytes = response.into_body().collect_bytes().await?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Outcome {
        status,
        body,
        warnings,
        elapsed,
    })
}

/// The stored object at `path`, if any.
async fn stored(client: &Client, path: &str) -> Result<Option<Value>> {
    let request = http::Request::get(path).body(kube::client::Body::empty())?;
    let response = client.send(request).await?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect_bytes().await?;
    match status {
        200 => Ok(Some(serde_json::from_slice(&bytes)?)),
        404 => Ok(None),
        other => bail!("GET {path}: {other} {}", String::from_utf8_lossy(&bytes)),
    }
}

fn deployment(name: &str, image: &str) -> Value {
    deployment_object(
        name,
        json!({"containers": [{"name": "app", "image": image}]}),
    )
}

fn pods_path(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/pods")
}

/// Whether a denial carries `message` followed by the images that failed verification, the
/// first of them `image` (the `messageExpression` of [`policy_yaml`]).
fn denial_names(outcome: &Outcome, message: &str, image: &str) -> bool {
    outcome.message().contains(&format!("{message}: {image}"))
}

/// The test policy: the fixture cosign key must have signed every container image from the
/// given registries, in namespaces labelled `ivory-e2e/tier=<tier>`. The denial message is
/// `<message>: <unsigned images>`, with `message` as the fallback should the expression fail.
fn policy_yaml(
    name: &str,
    tier: &str,
    failure: &str,
    hosts: &[&str],
    message: &str,
    verify_digest: bool,
) -> String {
    let attestors = fixture_key_attestors().unwrap_or_default();
    // A CEL string literal inside a YAML block scalar.
    let literal = message.replace('\\', "\\\\").replace('\'', "\\'");
    let policy = hosts
        .iter()
        .fold(PodPolicy::new(name), |p, h| p.glob(&format!("{h}/*")));
    policy
        .namespace_selector(&format!("      matchLabels:\n        {TIER_LABEL}: {tier}\n"))
        .spec(&format!(
            "  failurePolicy: {failure}
  validationConfigurations:
    verifyDigest: {verify_digest}
  webhookConfiguration:
    timeoutSeconds: {WEBHOOK_TIMEOUT_SECS}
{attestors}  validations:
    - expression: >-
        {VERIFY_SIGNATURES}
      message: {message}
      messageExpression: >-
        '{literal}: ' + images.containers.filter(i, verifyImageSignatures(i, [attestors.key]) == 0).join(', ')
"
        ))
        .yaml()
}

/// Registers the configurations `ivory webhooks` prints for `policies`, replacing older ones.
async fn register_webhooks(
    client: &Client,
    policies: &Path,
    base_url: &str,
    ca: &Path,
) -> Result<(String, String)> {
    let (code, stdout, stderr) = run_ivory(
        [
            OsStr::new("webhooks"),
            OsStr::new("--policies"),
            policies.as_os_str(),
            OsStr::new("--url"),
            OsStr::new(base_url),
            OsStr::new("--ca-bundle"),
            ca.as_os_str(),
            OsStr::new("--domain"),
            OsStr::new("e2e.ivory.test"),
        ],
        &[],
    )
    .await?;
    ensure!(code == 0, "ivory webhooks failed ({code}): {stderr}");
    let mut names = (String::new(), String::new());
    for value in serde_saphyr::from_multiple::<Value>(&stdout)? {
        match value["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => {
                let config: MutatingWebhookConfiguration = serde_json::from_value(value)?;
                let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
                names.0 = recreate(&api, config).await?;
            }
            Some("ValidatingWebhookConfiguration") => {
                let config: ValidatingWebhookConfiguration = serde_json::from_value(value)?;
                let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
                names.1 = recreate(&api, config).await?;
            }
            other => bail!("unexpected document kind {other:?} from ivory webhooks"),
        }
    }
    Ok(names)
}

async fn recreate<K>(api: &Api<K>, object: K) -> Result<String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let name = object
        .meta()
        .name
        .clone()
        .context("configuration without a name")?;
    if api.get_opt(&name).await?.is_some() {
        api.delete(&name, &DeleteParams::default()).await?;
    }
    api.create(&PostParams::default(), &object).await?;
    Ok(name)
}

/// Everything one run sets up.
struct Env {
    client: Client,
    fail_ns: String,
    ignore_ns: String,
    /// Namespace whose policy reads images from the registry that needs a login.
    auth_ns: String,
    /// ivory's own namespace (POD_NAMESPACE), where the credentials Secret lives.
    own_ns: String,
    /// The signed fixture in the login-only registry, and its digest.
    auth_signed: (String, String),
    control_ns: String,
    signed: String,
    signed_digest: String,
    unsigned: String,
    hung_image: String,
    ivory: IvoryServer,
    matrix: FailureMatrix,
    dir: tempfile::TempDir,
    policy_files: PathBuf,
    ca: PathBuf,
    hosts: (String, String),
    kubeconfig: std::ffi::OsString,
    // Kept alive for the whole run.
    _registry: Harness,
    _hung: HungRegistry,
    auth_registry: Harness,
}

impl Env {
    /// Creates the pod, records the row and returns the outcome and the stored object.
    async fn pod(
        &self,
        scenario: &str,
        ns: &str,
        name: &str,
        images: &[&str],
        dry_run: bool,
    ) -> Result<(Outcome, Option<Value>)> {
        let outcome = create(
            &self.client,
            &pods_path(ns),
            &pod_object_with_images(name, images),
            dry_run,
        )
        .await?;
        let kept = stored(&self.client, &format!("{}/{name}", pods_path(ns))).await?;
        let kind = if dry_run {
            "CREATE (dryRun=All)"
        } else {
            "CREATE"
        };
        self.record(
            scenario,
            format!("{kind} pod {ns}/{name} [{}]", images.join(", ")),
            &outcome,
            kept.as_ref(),
        );
        Ok((outcome, kept))
    }

    fn record(&self, scenario: &str, request: String, outcome: &Outcome, kept: Option<&Value>) {
        self.matrix.record(Row {
            scenario: scenario.to_owned(),
            request,
            response: outcome.summary(),
            stored: if kept.is_some() { "yes" } else { "no" }.to_owned(),
            uid: kept
                .and_then(|v| v["metadata"]["uid"].as_str())
                .unwrap_or("")
                .to_owned(),
            millis: Some(outcome.elapsed.as_millis()),
        });
    }

    fn note(&self, scenario: &str, request: &str, response: &str) {
        self.matrix.record(Row {
            scenario: scenario.to_owned(),
            request: request.to_owned(),
            response: response.to_owned(),
            stored: "n/a".to_owned(),
            ..Row::default()
        });
    }

    /// Runs `ivory doctor` against the test cluster: (exit code, report).
    async fn doctor(&self) -> Result<(i32, String)> {
        let env = [
            ("KUBECONFIG", self.kubeconfig.as_os_str()),
            ("IVORY_LOG", OsStr::new("warn")),
        ];
        let (code, stdout, stderr) = run_ivory(["doctor"], &env).await?;
        Ok((code, format!("{stdout}{stderr}")))
    }

    /// Requires signatures on images of the login-only registry, read with the credentials of
    /// Secret [`PULL_SECRET`] in ivory's namespace.
    fn auth_yaml(&self) -> String {
        let host = self.auth_registry.host().to_owned();
        let name = "e2e-require-signed-auth";
        let yaml = policy_yaml(name, "auth", "Fail", &[&host], POLICY_MESSAGE, true);
        yaml.replacen(
            "spec:\n",
            &format!("spec:\n  credentials:\n    secrets: [{PULL_SECRET}]\n"),
            1,
        )
    }

    fn fail_yaml(&self, message: &str) -> String {
        let hosts = [self.hosts.0.as_str(), self.hosts.1.as_str()];
        policy_yaml(
            "e2e-require-signed-fail",
            "fail",
            "Fail",
            &hosts,
            message,
            true,
        )
    }

    fn ignore_yaml(&self, message: &str, verify_digest: bool) -> String {
        let hosts = [self.hosts.0.as_str(), self.hosts.1.as_str()];
        let name = "e2e-require-signed-ignore";
        policy_yaml(name, "ignore", "Ignore", &hosts, message, verify_digest)
    }

    /// Waits until an unsigned dry-run pod in `ns` is denied with `message` naming its image.
    async fn wait_denial(&self, ns: &str, message: &str) -> Result<Duration> {
        let start = ivory_clock::now();
        eventually(
            &format!("unsigned pods in {ns} denied with {message:?}"),
            PROPAGATION,
            || async {
                let outcome = create(
                    &self.client,
                    &pods_path(ns),
                    &pod_object_with_images(&unique_name("probe"), &[&self.unsigned]),
                    true,
                )
                .await?;
                if !outcome.created() && denial_names(&outcome, message, &self.unsigned) {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("{}", outcome.summary()))
                }
            },
        )
        .await?;
        Ok(start.elapsed())
    }
}

async fn setup() -> Result<Env> {
    let (cluster, client) = cluster_with_crds(&POLICY_CRDS).await?;

    let registry = RegistryHarness::start_default().await?;
    let ((signed, signed_digest), (unsigned, _)) = push_signed_and_unsigned(&registry).await?;
    let hung = HungRegistry::start().await?;
    let hung_image = format!("{}/ivory/slow:v1", hung.host());

    let auth_registry =
        RegistryHarness::start(HarnessOptions::basic(AUTH_USER, AUTH_PASSWORD)).await?;
    let auth_signed = push(&auth_registry, "sig-p256").await?;
    let auth_ns = namespace(&client, "e2e-auth", &[(TIER_LABEL, "auth")]).await?;
    let fail_ns = namespace(&client, "e2e-fail", &[(TIER_LABEL, "fail")]).await?;
    let ignore_ns = namespace(&client, "e2e-ignore", &[(TIER_LABEL, "ignore")]).await?;
    let control_ns = namespace(&client, "e2e-control", &[]).await?;
    let own_ns = namespace(&client, "e2e-ivory", &[]).await?;

    let dir = tempfile::tempdir()?;
    let (_, _, ca) = tls(dir.path())?;
    let registry_ca = dir.path().join("registry-ca.pem");
    std::fs::write(
        &registry_ca,
        format!("{}\n{}", registry.ca_pem(), auth_registry.ca_pem()),
    )?;

    let kubeconfig = cluster.kubeconfig().as_os_str().to_owned();
    let envs = [
        ("KUBECONFIG", kubeconfig.as_os_str()),
        ("POD_NAMESPACE", OsStr::new(&own_ns)),
    ];
    let ivory = serve(dir.path(), &registry_ca, &[OsStr::new("--kube")], &envs).await?;
    let policy_files = dir.path().join("policies");
    std::fs::create_dir(&policy_files)?;
    let hosts = (registry.host().to_owned(), hung.host());
    Ok(Env {
        client,
        fail_ns,
        ignore_ns,
        auth_ns,
        own_ns,
        auth_signed,
        control_ns,
        signed,
        signed_digest,
        unsigned,
        hung_image,
        ivory,
        matrix: FailureMatrix::default(),
        dir,
        policy_files,
        ca,
        hosts,
        kubeconfig,
        _registry: registry,
        _hung: hung,
        auth_registry,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_matrix() -> Result<()> {
    let env = setup().await?;
    let result = scenarios(&env).await;
    let path = report_path("failure-matrix.md");
    env.matrix.write(
        &path,
        "ivory webhook failure matrix (kube-apiserver v1.37, ivory serve --kube)",
    )?;
    eprintln!(
        "failure matrix written to {}\n{}",
        path.display(),
        env.matrix.markdown()
    );
    if let Err(e) = &result {
        eprintln!("ivory log:\n{}", env.ivory.logs());
        bail!("{e:#}");
    }
    Ok(())
}

async fn scenarios(env: &Env) -> Result<()> {
    // The policies exist as CRs (ivory picks them up through its watch) and the webhooks are
    // registered from the same documents.
    let (fail_yaml, ignore_yaml) = (
        env.fail_yaml(POLICY_MESSAGE),
        env.ignore_yaml(POLICY_MESSAGE, true),
    );
    apply_policy(&env.client, &fail_yaml).await?;
    apply_policy(&env.client, &ignore_yaml).await?;
    // The credentials Secret appears after ivory started: its Secret watch must pick it up.
    create_pull_secret(env).await?;
    let auth_yaml = env.auth_yaml();
    apply_policy(&env.client, &auth_yaml).await?;
    std::fs::write(env.policy_files.join("auth.yaml"), &auth_yaml)?;
    std::fs::write(env.policy_files.join("fail.yaml"), &fail_yaml)?;
    std::fs::write(env.policy_files.join("ignore.yaml"), &ignore_yaml)?;
    let configs = register_webhooks(
        &env.client,
        &env.policy_files,
        &env.ivory.base_url(),
        &env.ca,
    )
    .await?;
    env.wait_denial(&env.fail_ns, POLICY_MESSAGE).await?;
    env.wait_denial(&env.ignore_ns, POLICY_MESSAGE).await?;

    let signed_uid = scenario_1_enforced(env).await?;
    scenario_9_registry_credentials(env).await?;
    scenario_3_paused(env).await?;
    scenario_4_slow_registry(env).await?;
    scenario_2_dry_run(env).await?;
    scenario_7_autogen_and_policy_change(env, &signed_uid).await?;
    scenario_10_broken_update(env).await?;
    scenario_6_sidecar(env).await?;
    scenario_5_registration_removed(env, &configs).await?;
    Ok(())
}

/// Scenario 1: signed stored pinned to its digest; unsigned denied with the policy's message naming
/// the image; unsigned in
/// a control namespace stored.
async fn scenario_1_enforced(env: &Env) -> Result<String> {
    let s = "1 enforced";
    let (outcome, kept) = env
        .pod(s, &env.fail_ns, "signed", &[&env.signed], false)
        .await?;
    ensure!(
        outcome.created(),
        "signed pod refused: {}",
        outcome.summary()
    );
    let kept = kept.context("signed pod not stored")?;
    let pinned = format!("{}@{}", env.signed, env.signed_digest);
    assert_eq!(kept["spec"]["containers"][0]["image"], pinned.as_str());
    let uid = kept["metadata"]["uid"].as_str().unwrap_or("").to_owned();

    let (outcome, kept) = env
        .pod(s, &env.fail_ns, "unsigned", &[&env.unsigned], false)
        .await?;
    ensure!(
        !outcome.created() && kept.is_none(),
        "unsigned pod: {}",
        outcome.summary()
    );
    ensure!(
        denial_names(&outcome, POLICY_MESSAGE, &env.unsigned),
        "{}",
        outcome.summary()
    );
    ensure!(
        outcome.message().contains("e2e-require-signed-fail"),
        "{}",
        outcome.summary()
    );

    let (outcome, kept) = env
        .pod(s, &env.control_ns, "unsigned", &[&env.unsigned], false)
        .await?;
    ensure!(
        outcome.created() && kept.is_some(),
        "control: {}",
        outcome.summary()
    );
    assert_eq!(
        outcome.first_image(),
        env.unsigned,
        "control pods are not mutated"
    );
    Ok(uid)
}

/// Scenarios 3 and 8: ivory frozen with its registration kept: Fail rejects after the timeout, Ignore
/// stores after it, the control namespace is unaffected; after SIGCONT, how long until the first
/// correct denial.
async fn scenario_3_paused(env: &Env) -> Result<()> {
    let s = "3 ivory paused (SIGSTOP)";
    env.ivory.pause().await?;
    let result = paused_checks(env, s).await;
    env.ivory.resume().await?;
    let resumed = ivory_clock::now();
    result?;

    let s = "8 recovery after SIGCONT";
    let mut attempt = 0;
    let denial = loop {
        attempt += 1;
        let name = format!("recover-{attempt}");
        let outcome = create(
            &env.client,
            &pods_path(&env.fail_ns),
            &pod_object_with_images(&name, &[&env.unsigned]),
            false,
        )
        .await?;
        if !outcome.created() && outcome.message().contains(POLICY_MESSAGE) {
            let kept = stored(&env.client, &format!("{}/{name}", pods_path(&env.fail_ns))).await?;
            ensure!(kept.is_none(), "a denied pod was stored");
            env.record(
                s,
                format!(
                    "CREATE pod {}/{name} (attempt {attempt} after SIGCONT)",
                    env.fail_ns
                ),
                &outcome,
                None,
            );
            break resumed.elapsed();
        }
        ensure!(
            resumed.elapsed() < PROPAGATION,
            "no correct denial {PROPAGATION:?} after SIGCONT: {}",
            outcome.summary()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    env.note(
        s,
        "time from SIGCONT to the first correct denial",
        &format!("{} ms", denial.as_millis()),
    );
    Ok(())
}

async fn paused_checks(env: &Env, s: &str) -> Result<()> {
    let timeout = Duration::from_secs(WEBHOOK_TIMEOUT_SECS);
    let (outcome, kept) = env
        .pod(s, &env.fail_ns, "paused-fail", &[&env.unsigned], false)
        .await?;
    ensure!(
        !outcome.created() && kept.is_none(),
        "Fail while paused: {}",
        outcome.summary()
    );
    ensure!(
        outcome.message().contains("failed calling webhook"),
        "{}",
        outcome.summary()
    );
    ensure!(
        outcome.elapsed >= timeout,
        "rejected before the timeout: {:?}",
        outcome.elapsed
    );

    let (outcome, kept) = env
        .pod(s, &env.ignore_ns, "paused-ignore", &[&env.unsigned], false)
        .await?;
    ensure!(
        outcome.created() && kept.is_some(),
        "Ignore while paused: {}",
        outcome.summary()
    );
    ensure!(
        outcome.elapsed >= timeout,
        "stored before the timeout: {:?}",
        outcome.elapsed
    );
    assert_eq!(
        outcome.first_image(),
        env.unsigned,
        "stored unpinned and unverified"
    );

    let (outcome, kept) = env
        .pod(
            s,
            &env.control_ns,
            "paused-control",
            &[&env.unsigned],
            false,
        )
        .await?;
    ensure!(
        outcome.created() && kept.is_some(),
        "control while paused: {}",
        outcome.summary()
    );
    ensure!(
        outcome.elapsed < timeout,
        "control namespace waited: {:?}",
        outcome.elapsed
    );
    // The registration is intact; only the endpoint layer fails.
    let (code, report) = env.doctor().await?;
    let endpoint = report
        .lines()
        .find(|l| l.starts_with("endpoint"))
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    env.note(
        s,
        "`ivory doctor` while paused",
        &format!("exit {code}: {endpoint}"),
    );
    ensure!(
        code == 1 && endpoint.contains("FAIL"),
        "ivory doctor while paused:\n{report}"
    );
    ensure!(
        !report
            .lines()
            .any(|l| l.starts_with("registration") && l.contains("FAIL")),
        "{report}"
    );
    Ok(())
}

/// Scenario 4: the image's registry accepts connections and never answers: ivory answers within its
/// budget, before the API server's timeout.
async fn scenario_4_slow_registry(env: &Env) -> Result<()> {
    let s = "4 slow registry";
    let limit = Duration::from_secs(WEBHOOK_TIMEOUT_SECS);
    let (outcome, kept) = env
        .pod(s, &env.fail_ns, "slow-fail", &[&env.hung_image], false)
        .await?;
    ensure!(
        !outcome.created() && kept.is_none(),
        "Fail, slow registry: {}",
        outcome.summary()
    );
    ensure!(
        !outcome.message().contains("failed calling webhook"),
        "the API server timed out instead of ivory answering: {}",
        outcome.summary()
    );
    ensure!(
        outcome.message().contains("ivory")
            || outcome.message().contains("e2e-require-signed-fail"),
        "{}",
        outcome.summary()
    );
    ensure!(outcome.elapsed < limit, "denial took {:?}", outcome.elapsed);

    // With verifyDigest (the default), the mutation skipped under Ignore leaves a tag; the
    // validating stage asks the registry for that tag itself, cannot get an answer either, and
    // so applies Ignore to the digest check too: admitted, with both stages' warnings.
    let (outcome, kept) = env
        .pod(
            s,
            &env.ignore_ns,
            "slow-ignore-digest",
            &[&env.hung_image],
            false,
        )
        .await?;
    ensure!(
        outcome.created() && kept.is_some(),
        "Ignore + verifyDigest, slow registry: {}",
        outcome.summary()
    );
    ensure!(
        outcome
            .warnings
            .iter()
            .any(|w| w.contains("without a pinned digest")),
        "{}",
        outcome.summary()
    );
    ensure!(
        outcome
            .warnings
            .iter()
            .any(|w| w.contains("digest check skipped")),
        "{}",
        outcome.summary()
    );
    ensure!(
        outcome.elapsed < limit * 2,
        "admission took {:?}",
        outcome.elapsed
    );

    let message = "images must be signed (no digest check)";
    apply_policy(&env.client, &env.ignore_yaml(message, false)).await?;
    env.wait_denial(&env.ignore_ns, message).await?;
    env.note(s, "Ignore policy updated: verifyDigest false", "applied");
    let (outcome, kept) = env
        .pod(s, &env.ignore_ns, "slow-ignore", &[&env.hung_image], false)
        .await?;
    ensure!(
        outcome.created() && kept.is_some(),
        "Ignore, slow registry: {}",
        outcome.summary()
    );
    ensure!(
        !outcome.warnings.is_empty(),
        "no warning from ivory: {}",
        outcome.summary()
    );
    // Two webhook calls (mutate, validate), each answered before its own timeout.
    ensure!(
        outcome.elapsed < limit * 2,
        "admission took {:?}",
        outcome.elapsed
    );
    Ok(())
}

/// Scenario 2: server-side dry-run runs the webhooks and stores nothing.
async fn scenario_2_dry_run(env: &Env) -> Result<()> {
    let s = "2 server-side dry-run";
    let (outcome, kept) = env
        .pod(s, &env.fail_ns, "dry-signed", &[&env.signed], true)
        .await?;
    ensure!(
        outcome.created() && kept.is_none(),
        "dry-run signed: {}",
        outcome.summary()
    );
    assert_eq!(
        outcome.first_image(),
        format!("{}@{}", env.signed, env.signed_digest),
        "the dry-run answer shows the mutation"
    );
    let (outcome, kept) = env
        .pod(s, &env.fail_ns, "dry-unsigned", &[&env.unsigned], true)
        .await?;
    ensure!(
        !outcome.created() && kept.is_none(),
        "dry-run unsigned: {}",
        outcome.summary()
    );
    ensure!(
        denial_names(&outcome, POLICY_MESSAGE, &env.unsigned),
        "{}",
        outcome.summary()
    );
    env.note(
        "2 client-side dry-run",
        "kubectl --dry-run=client",
        "never reaches the API server: no admission, proves nothing about the webhook (not run)",
    );
    Ok(())
}

/// Scenario 7: a Deployment with an unsigned image is denied at the Deployment (autogen); a running Pod
/// keeps its UID when the policy changes.
async fn scenario_7_autogen_and_policy_change(env: &Env, signed_uid: &str) -> Result<()> {
    let s = "7 autogen";
    let path = format!("/apis/apps/v1/namespaces/{}/deployments", env.fail_ns);
    let outcome = create(
        &env.client,
        &path,
        &deployment("unsigned", &env.unsigned),
        false,
    )
    .await?;
    let kept = stored(&env.client, &format!("{path}/unsigned")).await?;
    env.record(
        s,
        format!(
            "CREATE deployment {}/unsigned [{}]",
            env.fail_ns, env.unsigned
        ),
        &outcome,
        kept.as_ref(),
    );
    ensure!(
        !outcome.created() && kept.is_none(),
        "unsigned deployment: {}",
        outcome.summary()
    );
    ensure!(
        denial_names(&outcome, POLICY_MESSAGE, &env.unsigned),
        "{}",
        outcome.summary()
    );

    let outcome = create(
        &env.client,
        &path,
        &deployment("signed", &env.signed),
        false,
    )
    .await?;
    let kept = stored(&env.client, &format!("{path}/signed")).await?;
    env.record(
        s,
        format!("CREATE deployment {}/signed [{}]", env.fail_ns, env.signed),
        &outcome,
        kept.as_ref(),
    );
    ensure!(
        outcome.created() && kept.is_some(),
        "signed deployment: {}",
        outcome.summary()
    );
    let image = &outcome.body["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(
        image,
        &json!(format!("{}@{}", env.signed, env.signed_digest))
    );

    let s = "7 policy change";
    let changed = "images must be signed by the e2e key (v2)";
    apply_policy(&env.client, &env.fail_yaml(changed)).await?;
    let took = env.wait_denial(&env.fail_ns, changed).await?;
    env.note(
        s,
        "policy CR updated (new message)",
        &format!("new message enforced after {} ms", took.as_millis()),
    );
    let pod = stored(&env.client, &format!("{}/signed", pods_path(&env.fail_ns)))
        .await?
        .context("the running pod is gone")?;
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    env.matrix.record(Row {
        scenario: s.to_owned(),
        request: format!("GET pod {}/signed after the change", env.fail_ns),
        response: "200".to_owned(),
        stored: "yes".to_owned(),
        uid: uid.to_owned(),
        millis: None,
    });
    assert_eq!(uid, signed_uid, "the pod was replaced");
    // Back to the original policy for the scenarios after this one.
    apply_policy(&env.client, &env.fail_yaml(POLICY_MESSAGE)).await?;
    env.wait_denial(&env.fail_ns, POLICY_MESSAGE).await?;
    Ok(())
}

/// Scenario 5: the webhook registration removed while the policy CR remains: nothing is enforced.
async fn scenario_5_registration_removed(env: &Env, configs: &(String, String)) -> Result<()> {
    let s = "5 registration removed";
    let (code, report) = env.doctor().await?;
    let verdict = report.lines().last().unwrap_or("");
    env.note(
        s,
        "`ivory doctor` before the removal",
        &format!("exit {code}: {verdict}"),
    );
    ensure!(code == 0, "ivory doctor before the removal:\n{report}");
    ensure!(
        report.contains("e2e-require-signed-fail (validate)"),
        "{report}"
    );
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    mutating
        .delete(&configs.0, &DeleteParams::default())
        .await?;
    validating
        .delete(&configs.1, &DeleteParams::default())
        .await?;
    ensure!(
        dynamic(&env.client, IVPOL, None)
            .get_opt("e2e-require-signed-fail")
            .await?
            .is_some()
    );
    let start = ivory_clock::now();
    eventually(
        "unsigned dry-run pods to pass without the webhooks",
        PROPAGATION,
        || async {
            let outcome = create(
                &env.client,
                &pods_path(&env.fail_ns),
                &pod_object_with_images(&unique_name("probe"), &[&env.unsigned]),
                true,
            )
            .await?;
            if outcome.created() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{}", outcome.summary()))
            }
        },
    )
    .await?;
    let (outcome, kept) = env
        .pod(s, &env.fail_ns, "unregistered", &[&env.unsigned], false)
        .await?;
    ensure!(outcome.created() && kept.is_some(), "{}", outcome.summary());
    assert_eq!(
        outcome.first_image(),
        env.unsigned,
        "no mutation without registration"
    );
    let (code, report) = env.doctor().await?;
    let unregistered = report
        .lines()
        .find(|l| l.contains("e2e-require-signed-fail (validate)"))
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    env.note(
        s,
        "`ivory doctor` after the removal",
        &format!("exit {code}: {unregistered}"),
    );
    ensure!(
        code == 1,
        "ivory doctor after the removal exited {code}:\n{report}"
    );
    ensure!(
        unregistered.starts_with("registration") && unregistered.contains("FAIL"),
        "{report}"
    );
    env.note(
        s,
        "policy CR still present; webhook configurations deleted",
        &format!(
            "unsigned pods pass {} ms after the deletion",
            start.elapsed().as_millis()
        ),
    );
    Ok(())
}

/// Annotation telling the test sidecar injector which image to add.
const SIDECAR_ANNOTATION: &str = "e2e.ivory.test/sidecar-image";

/// A mutating webhook that adds a `sidecar` container with the image named by the pod's
/// annotation (once: reinvocations see the container and add nothing).
async fn inject_sidecar(body: axum::body::Bytes) -> axum::Json<Value> {
    use base64::Engine as _;
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request = &review["request"];
    let object = &request["object"];
    let image = object["metadata"]["annotations"][SIDECAR_ANNOTATION].as_str();
    let present = object["spec"]["containers"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["name"] == "sidecar"));
    let mut response = json!({"uid": request["uid"], "allowed": true});
    if let (Some(image), false) = (image, present) {
        let patch = json!([{"op": "add", "path": "/spec/containers/-",
                             "value": {"name": "sidecar", "image": image}}]);
        response["patchType"] = json!("JSONPatch");
        response["patch"] =
            json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
    }
    axum::Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// Serves [`inject_sidecar`] over TLS with ivory's test certificate; returns its port.
async fn start_sidecar_injector(
    env: &Env,
) -> Result<(u16, axum_server::Handle<std::net::SocketAddr>)> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(
        env.dir.path().join("tls.crt"),
        env.dir.path().join("tls.key"),
    )
    .await?;
    let router = axum::Router::new().route("/inject", axum::routing::post(inject_sidecar));
    let handle = axum_server::Handle::new();
    let server = axum_server::bind_rustls(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), config)
        .handle(handle.clone());
    tokio::spawn(server.serve(router.into_make_service()));
    let addr = handle
        .listening()
        .await
        .context("sidecar injector did not listen")?;
    Ok((addr.port(), handle))
}

/// Scenario 6: a sidecar injected by a later mutating webhook is pinned on ivory's
/// reinvocation (IfNeeded) and verified: unsigned denied naming the sidecar's image, signed
/// stored pinned.
async fn scenario_6_sidecar(env: &Env) -> Result<()> {
    let s = "6 sidecar injector";
    let (port, handle) = start_sidecar_injector(env).await?;
    let ca = std::fs::read(&env.ca)?;
    // Named to sort after ivory's configuration: the API server runs mutating webhooks in
    // configuration-name order, so ivory has already mutated when the sidecar arrives.
    let name = "zz-e2e-sidecar-injector";
    let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "sidecar.e2e.ivory.test",
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/inject"),
                "caBundle": k8s_openapi::ByteString(ca),
            },
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {TIER_LABEL: "fail"}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "reinvocationPolicy": "Never",
            "timeoutSeconds": 5
        }]
    }))?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    recreate(&api, config).await?;
    let result = sidecar_checks(env, s).await;
    api.delete(name, &DeleteParams::default()).await?;
    handle.shutdown();
    result
}

fn pod_with_sidecar(name: &str, image: &str, sidecar: &str) -> Value {
    let mut pod = pod_object_with_images(name, &[image]);
    pod["metadata"]["annotations"] = json!({SIDECAR_ANNOTATION: sidecar});
    pod
}

async fn sidecar_checks(env: &Env, s: &str) -> Result<()> {
    let path = pods_path(&env.fail_ns);
    // The injector's configuration takes a moment to reach the admission chain.
    eventually("the sidecar injector to be called", PROPAGATION, || async {
        let probe = pod_with_sidecar(&unique_name("probe"), &env.signed, &env.signed);
        let outcome = create(&env.client, &path, &probe, true).await?;
        let injected = outcome.body["spec"]["containers"]
            .as_array()
            .is_some_and(|c| c.len() == 2);
        if injected {
            Ok(())
        } else {
            Err(anyhow::anyhow!("{}", outcome.summary()))
        }
    })
    .await?;

    let pinned = format!("{}@{}", env.signed, env.signed_digest);
    let unsigned_pod = pod_with_sidecar("sidecar-unsigned", &env.signed, &env.unsigned);
    let outcome = create(&env.client, &path, &unsigned_pod, false).await?;
    let kept = stored(&env.client, &format!("{path}/sidecar-unsigned")).await?;
    let request = format!(
        "CREATE pod {}/sidecar-unsigned [{}] + injected sidecar [{}]",
        env.fail_ns, env.signed, env.unsigned
    );
    env.record(s, request, &outcome, kept.as_ref());
    ensure!(
        !outcome.created() && kept.is_none(),
        "unsigned sidecar: {}",
        outcome.summary()
    );
    // The denial names the injected sidecar's image, and only it: the main container (pinned
    // by then) passed verification.
    ensure!(
        denial_names(&outcome, POLICY_MESSAGE, &env.unsigned),
        "the denial does not name the sidecar's image {}: {}",
        env.unsigned,
        outcome.summary()
    );
    ensure!(
        !outcome.message().contains(&env.signed),
        "the denial names the signed main container {}: {}",
        env.signed,
        outcome.summary()
    );

    let signed_pod = pod_with_sidecar("sidecar-signed", &env.signed, &env.signed);
    let outcome = create(&env.client, &path, &signed_pod, false).await?;
    let kept = stored(&env.client, &format!("{path}/sidecar-signed")).await?;
    let request = format!(
        "CREATE pod {}/sidecar-signed [{}] + injected sidecar [{}]",
        env.fail_ns, env.signed, env.signed
    );
    env.record(s, request, &outcome, kept.as_ref());
    let kept = kept.context("signed sidecar pod not stored")?;
    let sidecar = kept["spec"]["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "sidecar"))
        .context("no sidecar container stored")?;
    assert_eq!(
        sidecar["image"],
        pinned.as_str(),
        "the sidecar is pinned by ivory's reinvocation"
    );
    assert_eq!(kept["spec"]["containers"][0]["image"], pinned.as_str());
    env.note(s, "stored sidecar image", &pinned);
    // The pin comes from ivory's reinvocation: two mutate calls for this pod.
    let mutate_calls = env
        .ivory
        .logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["fields"]["route"] == "ivpol_mutate" && v["fields"]["name"] == "sidecar-signed"
        })
        .count();
    env.note(
        s,
        "ivory mutate calls for sidecar-signed",
        &mutate_calls.to_string(),
    );
    ensure!(
        mutate_calls == 2,
        "expected ivory to be reinvoked once, saw {mutate_calls} mutate calls"
    );
    Ok(())
}

async fn create_pull_secret(env: &Env) -> Result<()> {
    use base64::Engine as _;
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    let host = env.auth_registry.host().to_owned();
    let config = json!({"auths": {host: {"auth": b64(&format!("{AUTH_USER}:{AUTH_PASSWORD}"))}}});
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": PULL_SECRET},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": b64(&config.to_string())}
    }))?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(env.client.clone(), &env.own_ns)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// Scenario 9: the registry refuses anonymous pulls; the policy names a pull Secret in ivory's
/// namespace, which ivory reads from its Secret watch (no `--docker-config`).
async fn scenario_9_registry_credentials(env: &Env) -> Result<()> {
    let s = "9 registry credentials (Secret)";
    let (image, digest) = &env.auth_signed;
    let pinned = format!("{image}@{digest}");
    let path = pods_path(&env.auth_ns);
    eventually(
        "the auth policy to pin dry-run pods",
        PROPAGATION,
        || async {
            let outcome = create(
                &env.client,
                &path,
                &pod_object_with_images(&unique_name("probe"), &[image]),
                true,
            )
            .await?;
            if outcome.created() && outcome.first_image() == pinned {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{}", outcome.summary()))
            }
        },
    )
    .await?;
    let (outcome, kept) = env
        .pod(s, &env.auth_ns, "signed-auth", &[image], false)
        .await?;
    ensure!(
        outcome.created(),
        "signed pod from the login-only registry: {}",
        outcome.summary()
    );
    let kept = kept.context("signed pod not stored")?;
    assert_eq!(kept["spec"]["containers"][0]["image"], pinned.as_str());
    let anonymous = env.auth_registry.http_client()?;
    let status = anonymous
        .get(format!(
            "{}/v2/ivory/sig-p256/manifests/v1",
            env.auth_registry.base_url()
        ))
        .send()
        .await?
        .status();
    env.note(s, "anonymous GET of the manifest", &status.to_string());
    ensure!(
        status.as_u16() == 401,
        "the registry served an anonymous client: {status}"
    );
    Ok(())
}

/// Scenario 10: a policy update that does not compile keeps the last good version of that
/// policy enforcing; `/readyz` (seen through `ivory doctor`) shows the error until it is fixed.
async fn scenario_10_broken_update(env: &Env) -> Result<()> {
    let s = "10 broken policy update";
    let good = env.fail_yaml(POLICY_MESSAGE);
    let broken = good.replacen(".all(e, e > 0)", ".all(e, e > 0", 1);
    ensure!(broken != good, "the policy text changed shape");
    apply_policy(&env.client, &broken).await?;
    let report = eventually("ivory to report the broken policy", PROPAGATION, || async {
        let (code, report) = env.doctor().await?;
        let endpoint = report
            .lines()
            .find(|l| l.starts_with("endpoint"))
            .unwrap_or("");
        if code == 1 && endpoint.contains("WARN") && endpoint.contains("e2e-require-signed-fail") {
            Ok(report)
        } else {
            Err(anyhow::anyhow!("exit {code}: {report}"))
        }
    })
    .await?;
    for layer in ["policy", "endpoint"] {
        let line = report
            .lines()
            .find(|l| l.starts_with(layer) && !l.contains(" ok "))
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        env.note(s, &format!("`ivory doctor` {layer} row"), &line);
    }
    let (outcome, kept) = env
        .pod(s, &env.fail_ns, "broken-unsigned", &[&env.unsigned], false)
        .await?;
    ensure!(
        !outcome.created() && kept.is_none(),
        "the last good version stopped enforcing: {}",
        outcome.summary()
    );
    ensure!(
        denial_names(&outcome, POLICY_MESSAGE, &env.unsigned),
        "{}",
        outcome.summary()
    );

    apply_policy(&env.client, &good).await?;
    eventually("the policy error to clear", PROPAGATION, || async {
        let (code, report) = env.doctor().await?;
        if code == 0 {
            Ok(())
        } else {
            Err(anyhow::anyhow!("exit {code}: {report}"))
        }
    })
    .await?;
    env.note(s, "policy fixed", "`ivory doctor` exit 0 again");
    Ok(())
}

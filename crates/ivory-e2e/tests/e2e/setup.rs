//! Set-up shared by the cluster tests: CRDs from the repository, fixture images pushed, labelled
//! namespaces, TLS for ivory, `ivory serve` with arguments, the webhooks `ivory webhooks`
//! prints, objects and policies applied server-side.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ivory_e2e::{Cluster, IvoryServer, eventually, run_ivory};
use ivory_testkit::policy::key_attestor_yaml;
use ivory_testkit::{Harness, TestPki};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

/// How long the API server may take to establish a CRD or put a webhook in its chain.
pub(crate) const PROPAGATION: Duration = Duration::from_secs(30);

/// The CRDs of the two policy kinds ivory serves.
pub(crate) const POLICY_CRDS: [&str; 2] = [
    "deploy/crds/policies.kyverno.io_imagevalidatingpolicies.yaml",
    "deploy/crds/policies.kyverno.io_namespacedimagevalidatingpolicies.yaml",
];
/// `ImageValidatingPolicy` for [`dynamic`].
pub(crate) const IVPOL: (&str, &str, &str, &str) = (
    "policies.kyverno.io",
    "v1",
    "ImageValidatingPolicy",
    "imagevalidatingpolicies",
);
/// `NamespacedImageValidatingPolicy` for [`dynamic`].
pub(crate) const NIVPOL: (&str, &str, &str, &str) = (
    "policies.kyverno.io",
    "v1",
    "NamespacedImageValidatingPolicy",
    "namespacedimagevalidatingpolicies",
);

pub(crate) fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `spec.attestors` with the fixture cosign key `fixtures/keys/cosign-p256.pub` (see
/// [`key_attestor_yaml`]).
pub(crate) fn fixture_key_attestors() -> Result<String> {
    let pem = std::fs::read_to_string(workspace().join("fixtures/keys/cosign-p256.pub"))
        .context("reading fixtures/keys/cosign-p256.pub")?;
    Ok(key_attestor_yaml(&pem))
}

/// Pushes the fixture image `fixtures/oci/ivory/<layout>` to `ivory/<layout>` on `h`:
/// (`host/ivory/<layout>:v1`, its digest).
pub(crate) async fn push(h: &Harness, layout: &str) -> Result<(String, String)> {
    Ok(h.push_fixture(layout).await?)
}

/// [`push`]es the signed (`sig-p256`) and the unsigned fixture images: (signed, unsigned).
pub(crate) async fn push_signed_and_unsigned(
    h: &Harness,
) -> Result<((String, String), (String, String))> {
    Ok((push(h, "sig-p256").await?, push(h, "unsigned").await?))
}

/// Creates a namespace `prefix-<unique>` labelled `ivory-e2e=true` and `labels`.
pub(crate) async fn namespace(
    client: &Client,
    prefix: &str,
    labels: &[(&str, &str)],
) -> Result<String> {
    Ok(ivory_e2e::create_labelled_namespace(client, prefix, labels).await?)
}

/// The shared test cluster and a client for it, with the CRD files `crds` installed (see
/// [`install_crds`]).
pub(crate) async fn cluster_with_crds(crds: &[&str]) -> Result<(&'static Cluster, Client)> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    install_crds(&client, crds).await?;
    Ok((cluster, client))
}

/// Installs CRD files (paths relative to the workspace) and waits until each is Established.
pub(crate) async fn install_crds(client: &Client, files: &[&str]) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in files {
        let text = std::fs::read_to_string(workspace().join(file))
            .with_context(|| format!("reading {file}"))?;
        let doc = serde_saphyr::from_multiple::<Value>(&text)
            .with_context(|| format!("parsing {file}"))?
            .into_iter()
            .find(|v| !v.is_null())
            .context("empty CRD file")?;
        let crd: CustomResourceDefinition = serde_json::from_value(doc)?;
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        server_side_apply(&api, &name, &crd).await?;
        eventually(&format!("CRD {name} Established"), PROPAGATION, || {
            let (api, name) = (api.clone(), name.clone());
            async move {
                let crd = api.get(&name).await?;
                let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
                if conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("not established yet"))
                }
            }
        })
        .await?;
    }
    Ok(())
}

/// TLS material for ivory in `dir`: (cert, key, CA).
pub(crate) fn tls(dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let pki = TestPki::generate("ivory e2e CA")?;
    let files = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.pem"));
    std::fs::write(&files.0, &pki.server_chain_pem)?;
    std::fs::write(&files.1, &pki.server_key_pem)?;
    std::fs::write(&files.2, &pki.ca_pem)?;
    Ok(files)
}

/// A temporary folder for ivory with its TLS files (see [`tls`]) and `registry`'s CA:
/// (folder, ivory's CA file, the registry CA file).
pub(crate) fn ivory_dir(registry: &Harness) -> Result<(tempfile::TempDir, PathBuf, PathBuf)> {
    let dir = tempfile::tempdir()?;
    let (_, _, ca) = tls(dir.path())?;
    let registry_ca = dir.path().join("registry-ca.pem");
    std::fs::write(&registry_ca, registry.ca_pem())?;
    Ok((dir, ca, registry_ca))
}

/// Starts `ivory serve` with the TLS files of [`tls`] in `dir`, trusting `registry_ca`.
pub(crate) async fn serve(
    dir: &Path,
    registry_ca: &Path,
    extra: &[&OsStr],
    envs: &[(&str, &OsStr)],
) -> Result<IvoryServer> {
    serve_listening("127.0.0.1:0", dir, registry_ca, extra, envs).await
}

/// [`serve`] on a given address (for webhooks written before ivory starts).
pub(crate) async fn serve_listening(
    listen: &str,
    dir: &Path,
    registry_ca: &Path,
    extra: &[&OsStr],
    envs: &[(&str, &OsStr)],
) -> Result<IvoryServer> {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("--tls-cert"),
        cert.as_os_str(),
        OsStr::new("--tls-key"),
        key.as_os_str(),
        OsStr::new("--registry-ca"),
        registry_ca.as_os_str(),
    ];
    args.extend_from_slice(extra);
    Ok(IvoryServer::start_listening(listen, args, envs).await?)
}

/// [`serve`] in file mode: `ivory serve --policies <policies>`, without the cluster.
pub(crate) async fn serve_policies(
    dir: &Path,
    registry_ca: &Path,
    policies: &Path,
) -> Result<IvoryServer> {
    serve(
        dir,
        registry_ca,
        &[OsStr::new("--policies"), policies.as_os_str()],
        &[],
    )
    .await
}

/// Registers what `ivory webhooks` prints for `policies`, named after `tag`; returns the
/// configurations to delete.
pub(crate) async fn register(
    client: &Client,
    policies: &Path,
    ivory: &IvoryServer,
    ca: &Path,
    tag: &str,
) -> Result<Vec<(String, String)>> {
    let domain = format!("{tag}.e2e.ivory.test");
    let base = ivory.base_url();
    let (code, stdout, stderr) = run_ivory(
        [
            OsStr::new("webhooks"),
            OsStr::new("--policies"),
            policies.as_os_str(),
            OsStr::new("--url"),
            OsStr::new(&base),
            OsStr::new("--ca-bundle"),
            ca.as_os_str(),
            OsStr::new("--domain"),
            OsStr::new(&domain),
        ],
        &[],
    )
    .await?;
    ensure!(code == 0, "ivory webhooks failed ({code}): {stderr}");
    let mut names = Vec::new();
    for mut value in serde_saphyr::from_multiple::<Value>(&stdout)? {
        let kind = value["kind"].as_str().unwrap_or("").to_owned();
        let name = format!("{tag}-{}", kind.to_lowercase());
        value["metadata"]["name"] = json!(name);
        let params = PostParams::default();
        match kind.as_str() {
            "MutatingWebhookConfiguration" => {
                let config: MutatingWebhookConfiguration = serde_json::from_value(value)?;
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .create(&params, &config)
                    .await?;
            }
            "ValidatingWebhookConfiguration" => {
                let config: ValidatingWebhookConfiguration = serde_json::from_value(value)?;
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .create(&params, &config)
                    .await?;
            }
            other => bail!("unexpected document kind {other:?} from ivory webhooks"),
        }
        names.push((kind, name));
    }
    Ok(names)
}

/// Deletes the configurations [`register`] created.
pub(crate) async fn unregister(client: &Client, names: &[(String, String)]) -> Result<()> {
    let params = DeleteParams::default();
    for (kind, name) in names {
        if kind == "MutatingWebhookConfiguration" {
            Api::<MutatingWebhookConfiguration>::all(client.clone())
                .delete(name, &params)
                .await?;
        } else {
            Api::<ValidatingWebhookConfiguration>::all(client.clone())
                .delete(name, &params)
                .await?;
        }
    }
    Ok(())
}

/// The dynamic API of `group/version kind (plural)`, in `namespace` when given.
pub(crate) fn dynamic(
    client: &Client,
    (group, version, kind, plural): (&str, &str, &str, &str),
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Server-side applies a YAML object through `api`.
pub(crate) async fn apply(api: &Api<DynamicObject>, yaml: &str) -> Result<()> {
    let object: DynamicObject = serde_json::from_value(serde_saphyr::from_str::<Value>(yaml)?)?;
    let name = object.metadata.name.clone().context("object has no name")?;
    server_side_apply(api, &name, &object).await
}

/// Server-side applies `object`, named `name`, through `api` (field manager `ivory-e2e`, forced).
async fn server_side_apply<K>(
    api: &Api<K>,
    name: &str,
    object: &(impl serde::Serialize + std::fmt::Debug),
) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("ivory-e2e").force(),
        &Patch::Apply(object),
    )
    .await?;
    Ok(())
}

/// Server-side applies a policy of either kind: namespaced when it names a namespace.
pub(crate) async fn apply_policy(client: &Client, yaml: &str) -> Result<()> {
    let object: DynamicObject = serde_json::from_value(serde_saphyr::from_str::<Value>(yaml)?)?;
    let api = match object.metadata.namespace.as_deref() {
        Some(ns) => dynamic(client, NIVPOL, Some(ns)),
        None => dynamic(client, IVPOL, None),
    };
    apply(&api, yaml).await
}

/// Sets what the kubelet would report for the Pod's one container `app` (the test cluster runs
/// no kubelet); returns the Pod as stored.
pub(crate) async fn set_running_digest(
    client: &Client,
    ns: &str,
    pod: &str,
    image: &str,
    image_id: &str,
) -> Result<Pod> {
    let status = json!({"status": {"containerStatuses": [{
        "name": "app",
        "image": image,
        "imageID": image_id,
        "ready": true,
        "restartCount": 0,
    }]}});
    Ok(Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
        .await?)
}

/// The API server's answer: status and body.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The HTTP status.
    pub(crate) status: u16,
    /// The body, `null` when it is not JSON.
    pub(crate) body: Value,
}

impl Answer {
    /// A 2xx status.
    pub(crate) fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The Status object's message (empty for an admitted object).
    pub(crate) fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    /// Refused, with `message` in the API server's message.
    pub(crate) fn denied_with(&self, message: &str) -> bool {
        !self.ok() && self.message().contains(message)
    }
}

/// Sends `body` (JSON) to `path` with `method` and `content_type`.
pub(crate) async fn send(
    client: &Client,
    method: http::Method,
    path: &str,
    content_type: &str,
    body: Option<&Value>,
) -> Result<Answer> {
    let bytes = match body {
        Some(b) => serde_json::to_vec(b)?,
        None => Vec::new(),
    };
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(bytes))?;
    let response = client.send(request).await?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect_bytes().await?;
    Ok(Answer {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    })
}

/// POSTs `object` to `collection`.
pub(crate) async fn create(client: &Client, collection: &str, object: &Value) -> Result<Answer> {
    send(
        client,
        http::Method::POST,
        collection,
        "application/json",
        Some(object),
    )
    .await
}

//! `ivory-bench convert-proof` (`scripts/convert-proof.sh`): the legacy corpus of
//! `fixtures/legacy/` judged side by side by the real Kyverno v1.19.1 (the legacy ClusterPolicies,
//! through its `/mutate` and `/validate` resource webhooks) and by `ivory serve` (their
//! conversions by `ivory convert`, through `/ivpol/mutate` and `/ivpol/validate`), on the same
//! registry, images, signatures and Pods. Kyverno runs out of cluster against the e2e
//! kube-apiserver with the machinery of `peers` ([`crate::peers`]); the API server also proves
//! that Kyverno's CRDs accept every converted policy (they are created as custom resources).
//!
//! Writes `verdicts.json` (each case's Kyverno and ivory verdict and Kyverno's message, with
//! Kyverno's version and the date) and fails when a verdict differs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use ivory_testkit::review::{create_review, legacy_case_image, legacy_case_object};
use ivory_testkit::{RegistryHarness, TestPki};
use serde_json::{Value, json};

use crate::peers::{self, Kube, KyvernoPaths};
use crate::procs::{Server, free_port};

/// Settings of `ivory-bench convert-proof`.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct ProofArgs {
    /// Folder of a cluster started by `scripts/e2e/cluster.sh start DIR`.
    #[arg(long)]
    cluster: PathBuf,
    /// Kyverno's admission controller, built by scripts/bench/build-kyverno.sh.
    #[arg(long)]
    kyverno: PathBuf,
    /// Kyverno's CRDs: `config/crds` of the Kyverno module source.
    #[arg(long)]
    kyverno_crds: PathBuf,
    /// The `ivory` binary.
    #[arg(long, default_value = "target/release/ivory")]
    ivory: PathBuf,
    /// The repository's fixtures folder (`legacy/cases.json`, `legacy/corpus/`, `oci/`).
    #[arg(long, default_value = "fixtures")]
    fixtures: PathBuf,
    /// Work folder (logs, converted policies).
    #[arg(long, default_value = "target/convert-proof")]
    out: PathBuf,
    /// Where the verdicts go.
    #[arg(long, default_value = "fixtures/legacy/verdicts.json")]
    verdicts: PathBuf,
    /// The date recorded with the verdicts (UTC, from the script).
    #[arg(long)]
    date: String,
}

/// One case of `cases.json`.
struct Case {
    name: String,
    /// The case as written (its object: [`ivory_testkit::review::legacy_case_object`]).
    raw: Value,
    /// `userInfo.username` of the request.
    user: String,
    /// A documented Kyverno bug, or a documented difference of the conversion, that makes
    /// Kyverno's verdict differ from ivory's on purpose.
    kyverno_bug: Option<String>,
    layout: String,
    repo: String,
    by_digest: bool,
    /// The image as written, instead of a pushed layout (a registry that does not answer).
    image: Option<String>,
}

/// What one webhook said about one Pod.
struct Verdict {
    allowed: bool,
    message: String,
    /// The container's image after the mutating webhook's patch (digest pinning).
    image: String,
}

/// Runs the proof.
pub(crate) async fn run(args: ProofArgs) -> Result<()> {
    let work = args.out.clone();
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    std::fs::create_dir_all(work.join("legacy"))?;
    let cases = read_cases(&args.fixtures.join("legacy/cases.json"))?;
    let registry = RegistryHarness::start_default()
        .await
        .context("starting docker-registry")?;
    let host = registry.host().to_owned();
    let mut digests = BTreeMap::new();
    for case in &cases {
        if case.image.is_some() || digests.contains_key(&case.repo) {
            continue;
        }
        let layout = args.fixtures.join("oci/ivory").join(&case.layout);
        let tags = registry
            .push_oci_layout(&layout, &case.repo)
            .await
            .with_context(|| format!("pushing {}", layout.display()))?;
        let digest = tags.get("v1").cloned().context("layout without tag v1")?;
        digests.insert(case.repo.clone(), digest);
    }
    let registry_ca = work.join("registry-ca.pem");
    std::fs::write(&registry_ca, registry.ca_pem())?;

    eprintln!("convert-proof: converting the corpus with `ivory convert`…");
    let legacy = legacy_files(
        &args.fixtures.join("legacy/corpus"),
        &work.join("legacy"),
        &host,
    )?;
    let converted = work.join("converted");
    let out = std::process::Command::new(&args.ivory)
        .arg("convert")
        .args(&legacy)
        .arg("-o")
        .arg(&converted)
        .output()
        .context("running ivory convert")?;
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    std::fs::write(work.join("convert-report.txt"), &report)?;
    ensure!(out.status.success(), "ivory convert failed:\n{report}");

    eprintln!(
        "convert-proof: Kyverno's CRDs, the legacy policies and the converted ones as custom resources…"
    );
    let kube = Kube::open(&args.cluster)?;
    peers::install_kyverno(&kube, &args.kyverno_crds).await?;
    // The Tekton kinds the corpus matches, known to discovery before Kyverno starts.
    let tekton = args.fixtures.join("legacy/tekton-crds.yaml");
    for doc in ivory_policy::yaml_documents(&std::fs::read_to_string(&tekton)?) {
        let crd = doc
            .value
            .map_err(|e| anyhow::anyhow!("{}: {e}", tekton.display()))?;
        kube.create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            "application/json",
            crd.to_string(),
        )
        .await
        .with_context(|| format!("creating a CRD of {}", tekton.display()))?;
    }
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "free"}});
    kube.create("/api/v1/namespaces", "application/json", ns.to_string())
        .await?;
    // The cluster objects the corpus reads (a ConfigMap of keys): Kyverno reads them from the
    // cluster, ivory from the same file (--cluster-resources).
    let cluster_resources = args.fixtures.join("legacy/cluster-resources.yaml");
    let (_, namespace, _) = identity(&std::fs::read_to_string(&cluster_resources)?)?;
    let namespace = namespace.unwrap_or_else(|| "default".to_owned());
    kube.create(
        &format!("/api/v1/namespaces/{namespace}/configmaps"),
        "application/yaml",
        std::fs::read_to_string(&cluster_resources)?,
    )
    .await
    .with_context(|| format!("creating {}", cluster_resources.display()))?;
    for file in &legacy {
        let text = std::fs::read_to_string(file)?;
        let (kind, namespace, _) = identity(&text)?;
        let path = match (kind.as_str(), namespace) {
            ("Policy", Some(ns)) => format!("/apis/kyverno.io/v1/namespaces/{ns}/policies"),
            _ => "/apis/kyverno.io/v1/clusterpolicies".to_owned(),
        };
        kube.create(&path, "application/yaml", text)
            .await
            .with_context(|| format!("creating the legacy policy {}", file.display()))?;
    }
    // Routes as the generated webhooks name them: cluster policies on /ivpol, namespaced ones
    // on /nivpol, each path listing its policies.
    let mut cluster_names = Vec::new();
    let mut namespaced_names = Vec::new();
    for file in sorted_yaml(&converted)? {
        let text = std::fs::read_to_string(&file)?;
        let (kind, namespace, name) = identity(&text)?;
        let path = match namespace {
            Some(ns) if kind == "NamespacedImageValidatingPolicy" => {
                namespaced_names.push(name);
                format!(
                    "/apis/policies.kyverno.io/v1/namespaces/{ns}/namespacedimagevalidatingpolicies"
                )
            }
            _ => {
                cluster_names.push(name);
                "/apis/policies.kyverno.io/v1/imagevalidatingpolicies".to_owned()
            }
        };
        kube.create(&path, "application/yaml", text)
            .await
            .with_context(|| {
                format!(
                    "Kyverno's CRD refused the converted policy {}",
                    file.display()
                )
            })?;
        // Accepted by the CRD; now out of Kyverno's way: Kyverno v1.19.1 names the webhooks
        // of cluster and namespaced ImageValidatingPolicies alike, and with both present the
        // API server rejects its webhook configurations (duplicate names) and it never becomes
        // ready. The legacy policies are what Kyverno is asked about.
        if kind == "NamespacedImageValidatingPolicy" {
            let name = namespaced_names.last().cloned().unwrap_or_default();
            kube.delete(&format!("{path}/{name}")).await?;
        }
    }
    let mut ivory_routes = Vec::new();
    for (prefix, names) in [("ivpol", &cluster_names), ("nivpol", &namespaced_names)] {
        if !names.is_empty() {
            ivory_routes.push((
                format!("/{prefix}/mutate/{}", names.join("/")),
                format!("/{prefix}/validate/{}", names.join("/")),
            ));
        }
    }

    eprintln!("convert-proof: starting Kyverno and ivory…");
    let paths = KyvernoPaths {
        binary: &args.kyverno,
        cluster: &args.cluster,
        registry_ca: &registry_ca,
        work: &work,
    };
    let (kyverno, kyverno_client, _) = peers::start_kyverno_with(&paths, &kube).await?;
    let ivory_files = IvoryFiles {
        policies: &converted,
        registry_ca: &registry_ca,
        cluster_resources: &cluster_resources,
    };
    let (ivory, ivory_client) = start_ivory(&args.ivory, &work, &ivory_files).await?;

    let image = |case: &Case| -> String {
        if let Some(image) = &case.image {
            image.clone()
        } else if case.by_digest {
            format!("{host}/{}@{}", case.repo, digests[&case.repo])
        } else {
            format!("{host}/{}:v1", case.repo)
        }
    };
    wait_for_kyverno(&kyverno_client, &kyverno.url, &cases, &image).await?;

    let mut rows = Vec::new();
    let mut differ = Vec::new();
    for case in &cases {
        let object = legacy_case_object(&case.raw, &image(case));
        let kyverno_routes = [("/mutate".to_owned(), "/validate".to_owned())];
        let k = through(
            &kyverno_client,
            &kyverno.url,
            &kyverno_routes,
            &object,
            &case.user,
        )
        .await?;
        let i = through(
            &ivory_client,
            &ivory.url,
            &ivory_routes,
            &object,
            &case.user,
        )
        .await?;
        let word = |v: &Verdict| if v.allowed { "allow" } else { "deny" };
        eprintln!(
            "{:<36} kyverno {:<5} ivory {:<5}",
            case.name,
            word(&k),
            word(&i)
        );
        if k.allowed != i.allowed {
            match &case.kyverno_bug {
                Some(bug) => eprintln!("  differs as documented: {bug}"),
                None => differ.push(case.name.clone()),
            }
        } else if case.kyverno_bug.is_some() {
            // The bug no longer shows: the case's note must go.
            differ.push(format!(
                "{} (documented Kyverno bug not reproduced)",
                case.name
            ));
        }
        let host_free = |v: &Verdict| v.image.replacen(&host, "REGISTRY_HOST", 1);
        if k.allowed && i.allowed && k.image != i.image {
            eprintln!(
                "  the admitted image differs: kyverno {} ivory {}",
                k.image, i.image
            );
        }
        rows.push(json!({
            "name": case.name,
            "kyverno": word(&k),
            "ivory": word(&i),
            "kyvernoImage": host_free(&k),
            "ivoryImage": host_free(&i),
            "kyvernoMessage": k.message.replace(&host, "REGISTRY_HOST"),
            "ivoryMessage": i.message.replace(&host, "REGISTRY_HOST"),
        }));
    }
    drop(kyverno);
    drop(ivory);
    let verdicts = json!({
        "about": "Verdicts of the ivory convert proof (scripts/convert-proof.sh): each case of cases.json judged by Kyverno with the legacy corpus and by ivory with its conversion. Generated; do not edit.",
        "kyvernoVersion": "v1.19.1",
        "date": args.date,
        "cases": rows,
    });
    std::fs::write(
        &args.verdicts,
        serde_json::to_string_pretty(&verdicts)? + "\n",
    )
    .with_context(|| format!("writing {}", args.verdicts.display()))?;
    eprintln!(
        "convert-proof: verdicts written to {}",
        args.verdicts.display()
    );
    ensure!(
        differ.is_empty(),
        "verdicts differ on: {}",
        differ.join(", ")
    );
    Ok(())
}

fn read_cases(path: &Path) -> Result<Vec<Case>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value = serde_json::from_str(&text)?;
    let list = doc["cases"].as_array().context("cases.json: no cases")?;
    let field = |c: &Value, k: &str| -> Result<String> {
        c[k].as_str()
            .map(str::to_owned)
            .with_context(|| format!("cases.json: {k} missing"))
    };
    list.iter()
        .map(|c| {
            Ok(Case {
                name: field(c, "name")?,
                raw: c.clone(),
                user: c["user"].as_str().unwrap_or("alice").to_owned(),
                kyverno_bug: c["kyvernoBug"]
                    .as_str()
                    .or_else(|| c["difference"].as_str())
                    .map(str::to_owned),
                layout: c["layout"].as_str().unwrap_or_default().to_owned(),
                repo: c["repo"].as_str().unwrap_or_default().to_owned(),
                image: c["image"].as_str().map(str::to_owned),
                by_digest: c["byDigest"].as_bool().unwrap_or(false),
            })
        })
        .collect()
}

/// The corpus with `REGISTRY_HOST` replaced, written under `dir`.
fn legacy_files(corpus: &Path, dir: &Path, host: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for file in sorted_yaml(corpus)? {
        let text = std::fs::read_to_string(&file)?.replace("REGISTRY_HOST", host);
        let target = dir.join(file.file_name().context("file name")?);
        std::fs::write(&target, text)?;
        out.push(target);
    }
    Ok(out)
}

fn sorted_yaml(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// What `ivory serve` reads in the proof.
struct IvoryFiles<'a> {
    /// The converted policies' folder.
    policies: &'a Path,
    registry_ca: &'a Path,
    /// The cluster objects the policies read (`--cluster-resources`).
    cluster_resources: &'a Path,
}

async fn start_ivory(
    bin: &Path,
    work: &Path,
    files: &IvoryFiles<'_>,
) -> Result<(Server, reqwest::Client)> {
    let pki = TestPki::generate("convert-proof webhook CA").context("webhook PKI")?;
    let cert = work.join("webhook.pem");
    let key = work.join("webhook.key");
    std::fs::write(&cert, &pki.server_chain_pem)?;
    std::fs::write(&key, &pki.server_key_pem)?;
    let client = crate::loadgen::client(&pki.ca_pem, 8)?;
    let port = free_port()?;
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("serve")
        .arg("--policies")
        .arg(files.policies)
        .arg("--cluster-resources")
        .arg(files.cluster_resources)
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--registry-ca")
        .arg(files.registry_ca)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"));
    let url = format!("https://127.0.0.1:{port}");
    let server = Server::start(
        "ivory",
        cmd,
        &work.join("ivory.log"),
        url,
        "/readyz",
        &client,
    )
    .await?;
    Ok((server, client))
}

/// Until Kyverno's engine holds the legacy policies, it admits everything: wait until it denies
/// the first case whose expected verdict is a denial by every reading (an unsigned image under
/// an enforced key policy).
async fn wait_for_kyverno(
    client: &reqwest::Client,
    base: &str,
    cases: &[Case],
    image: &dyn Fn(&Case) -> String,
) -> Result<()> {
    let probe = cases
        .iter()
        .find(|c| c.name == "key-unsigned")
        .context("cases.json: no key-unsigned case to probe Kyverno with")?;
    let started = ivory_clock::now();
    loop {
        let routes = [("/mutate".to_owned(), "/validate".to_owned())];
        let v = through(
            client,
            base,
            &routes,
            &legacy_case_object(&probe.raw, &image(probe)),
            &probe.user,
        )
        .await?;
        if !v.allowed {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!(
                "Kyverno still admits {} after 120 s: {}",
                image(probe),
                v.message
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The mutating webhooks in turn, each patch applied, then the validating webhooks: the API
/// server's order. `routes` are (mutate, validate) paths.
async fn through(
    client: &reqwest::Client,
    base: &str,
    routes: &[(String, String)],
    object: &Value,
    user: &str,
) -> Result<Verdict> {
    let uid = "0b7c1f5e-5d7a-4c59-9f3e-2a1d4c8b9e01";
    let mut object = object.clone();
    for (mutate, _) in routes {
        let answer = post(
            client,
            &format!("{base}{mutate}"),
            &create_review(uid, &object, user),
        )
        .await?;
        let response = &answer["response"];
        if response["allowed"] != true {
            return Ok(denied(response, &object));
        }
        if let Some(patch) = response["patch"].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(patch)
                .context("patch is not base64")?;
            let ops: Value = serde_json::from_slice(&bytes).context("patch is not JSON")?;
            apply_patch(&mut object, &ops)?;
        }
    }
    let mut warnings = Vec::new();
    for (_, validate) in routes {
        let answer = post(
            client,
            &format!("{base}{validate}"),
            &create_review(uid, &object, user),
        )
        .await?;
        let response = &answer["response"];
        if response["allowed"] != true {
            return Ok(denied(response, &object));
        }
        if let Some(list) = response["warnings"].as_array() {
            warnings.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
        }
    }
    Ok(Verdict {
        image: legacy_case_image(&object),
        allowed: true,
        message: warnings.join("; "),
    })
}

/// Kind, namespace and name of a YAML policy document.
fn identity(text: &str) -> Result<(String, Option<String>, String)> {
    let doc: Value = ivory_policy::yaml::from_str(text).context("not YAML")?;
    let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
    let namespace = doc["metadata"]["namespace"].as_str().map(str::to_owned);
    let name = doc["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((kind, namespace, name))
}

fn denied(response: &Value, object: &Value) -> Verdict {
    Verdict {
        image: legacy_case_image(object),
        allowed: false,
        message: response["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    }
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Result<Value> {
    let res = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .timeout(Duration::from_secs(60))
        .body(body.to_string())
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = res.status();
    let text = res.text().await.unwrap_or_default();
    ensure!(status.is_success(), "POST {url}: {status}: {text}");
    serde_json::from_str(&text).with_context(|| format!("POST {url}: not JSON: {text}"))
}

/// RFC 6902 `add`, `replace` and `remove`: what admission webhooks send.
fn apply_patch(doc: &mut Value, ops: &Value) -> Result<()> {
    for op in ops.as_array().context("patch is not a list")? {
        let path = op["path"].as_str().context("patch op without path")?;
        let (parent, last) = path.rsplit_once('/').context("patch path without /")?;
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc
            .pointer_mut(parent)
            .with_context(|| format!("patch path {path}: no parent"))?;
        match (op["op"].as_str(), target) {
            (Some("add" | "replace"), Value::Object(map)) => {
                map.insert(last, op["value"].clone());
            }
            (Some("add"), Value::Array(list)) if last == "-" => list.push(op["value"].clone()),
            (Some(kind @ ("add" | "replace")), Value::Array(list)) => {
                let i: usize = last.parse().context("array index")?;
                ensure!(i <= list.len(), "patch index {i} out of range");
                if kind == "add" {
                    list.insert(i, op["value"].clone());
                } else {
                    ensure!(i < list.len(), "patch index {i} out of range");
                    list[i] = op["value"].clone();
                }
            }
            (Some("remove"), Value::Object(map)) => {
                map.remove(&last);
            }
            (Some("remove"), Value::Array(list)) => {
                let i: usize = last.parse().context("array index")?;
                ensure!(i < list.len(), "patch index {i} out of range");
                list.remove(i);
            }
            (other, _) => bail!("unsupported patch op {other:?} at {path}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_apply_like_the_api_server() {
        let mut doc = json!({"metadata": {}, "spec": {"containers": [{"image": "a"}]}});
        let ops = json!([
            {"op": "add", "path": "/metadata/annotations", "value": {}},
            {"op": "add", "path": "/metadata/annotations/kyverno.io~1verify-images", "value": "x"},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "a@sha256:1"},
        ]);
        apply_patch(&mut doc, &ops).expect("applies");
        assert_eq!(
            doc["metadata"]["annotations"]["kyverno.io/verify-images"],
            "x"
        );
        assert_eq!(doc["spec"]["containers"][0]["image"], "a@sha256:1");
        assert!(apply_patch(&mut doc, &json!([{"op": "move", "path": "/a"}])).is_err());
    }
}

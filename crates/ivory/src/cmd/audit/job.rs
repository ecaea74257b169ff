//! `ivory audit … --job NAME`: the audit described by the other flags as a Kubernetes Indexed
//! Job of `--job-shards` shards (each Pod runs `ivory audit --shard $(JOB_COMPLETION_INDEX)/N
//! --shard-out` into a shared volume, the Job controller retries a failed index and the retry
//! resumes its part), with a ConfigMap holding the policy files. Credentials are mounted as the
//! chart mounts them for the webhook: the registry CA from a ConfigMap (`ca.crt`), the shared
//! cache's key from its Secret (`current`), registry logins from a docker-config Secret.
//! `ivory audit --merge` then joins the parts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::Args;

/// Where the Pods mount what the Job needs.
const POLICIES: &str = "/etc/ivory/audit-policies";
const PARTS: &str = "/var/lib/ivory-audit";
const REGISTRY_CA: &str = "/etc/ivory/registry-ca";
const CACHE_KEY: &str = "/etc/ivory/cache-key";
const DOCKER_CONFIG: &str = "/etc/ivory/docker";
/// A ConfigMap holds at most 1 MiB.
const MAX_POLICY_BYTES: usize = 1 << 20;

/// The `--job*` flags.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Indexed Job (--job)")]
pub(crate) struct JobOpts {
    /// Print (YAML) an Indexed Job that runs this registry audit as --job-shards shards, and a
    /// ConfigMap with its policy files, instead of auditing; `ivory audit --merge` then joins
    /// the parts the shards write into --job-parts-claim.
    #[arg(long = "job", value_name = "NAME")]
    pub(crate) job_name: Option<String>,
    /// Shards (the Job's completions).
    #[arg(
        long = "job-shards",
        value_name = "N",
        default_value_t = 4,
        requires = "job_name"
    )]
    job_shards: u32,
    /// Shards running at once (default: all).
    #[arg(long = "job-parallelism", value_name = "N", requires = "job_name")]
    job_parallelism: Option<u32>,
    /// Retries of one shard before it is given up (backoffLimitPerIndex).
    #[arg(
        long = "job-backoff-limit-per-index",
        value_name = "N",
        default_value_t = 3,
        requires = "job_name"
    )]
    job_backoff_limit_per_index: u32,
    /// The ivory image the Pods run (by digest, as the chart's image.digest).
    #[arg(long = "job-image", value_name = "IMAGE", requires = "job_name")]
    job_image: Option<String>,
    /// Namespace of the Job, its ConfigMap and the Secrets and ConfigMaps it mounts.
    #[arg(
        long = "job-namespace",
        value_name = "NS",
        default_value = "ivory-system",
        requires = "job_name"
    )]
    job_namespace: String,
    /// PersistentVolumeClaim the shards write their parts to (ReadWriteMany when the shards may
    /// run on several nodes); the parts go to `<claim>/<NAME>/`.
    #[arg(long = "job-parts-claim", value_name = "CLAIM", requires = "job_name")]
    job_parts_claim: Option<String>,
    /// ConfigMap with the registry CA (key `ca.crt`), for --registry-ca (the chart's
    /// registryCA.configMap).
    #[arg(
        long = "job-registry-ca-configmap",
        value_name = "NAME",
        requires = "job_name"
    )]
    job_registry_ca_configmap: Option<String>,
    /// Secret with the shared cache's HMAC key (key `current`), for --cache-redis-key (the
    /// chart's sharedCache.keySecret).
    #[arg(
        long = "job-cache-key-secret",
        value_name = "NAME",
        requires = "job_name"
    )]
    job_cache_key_secret: Option<String>,
    /// kubernetes.io/dockerconfigjson Secret with registry logins, for --docker-config.
    #[arg(
        long = "job-docker-config-secret",
        value_name = "NAME",
        requires = "job_name"
    )]
    job_docker_config_secret: Option<String>,
}

/// The ConfigMap and the Job, as one YAML stream.
pub(super) fn manifests(args: &Args, job: &JobOpts, name: &str) -> anyhow::Result<String> {
    refuse_unsupported(args, job)?;
    let image = job
        .job_image
        .as_deref()
        .context("--job needs --job-image: the ivory image its Pods run")?;
    let claim = job
        .job_parts_claim
        .as_deref()
        .context("--job needs --job-parts-claim: the volume the shards write their parts to")?;
    let policies = policy_files(&args.policies)?;
    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": format!("{name}-policies"), "namespace": job.job_namespace, "labels": labels(name)},
        "data": policies,
    });
    let job_object = indexed_job(args, job, name, image, claim);
    Ok(format!(
        "{}---\n{}",
        ivory_policy::yaml::to_string(&config_map)?,
        ivory_policy::yaml::to_string(&job_object)?
    ))
}

fn refuse_unsupported(args: &Args, job: &JobOpts) -> anyhow::Result<()> {
    if args.registries.is_empty() {
        bail!("--job audits registries: give --registry HOST");
    }
    if args.policies.is_empty() {
        bail!("--job needs --policy FILE (the policies go into the Job's ConfigMap)");
    }
    let unsupported = [
        (!args.images_from.is_empty(), "--images-from"),
        (args.kubeconfig.is_some(), "--kubeconfig"),
        (
            args.policy_report.is_some(),
            "--policy-report (the merge writes it)",
        ),
        (
            args.quick.key.is_some() || args.quick.certificate_identity.is_some(),
            "--key/--certificate-identity (write a policy file)",
        ),
    ];
    if let Some((_, flag)) = unsupported.iter().find(|(given, _)| *given) {
        bail!("--job cannot carry {flag}");
    }
    let access = &args.registry.access;
    if access.registry_ca.is_some() && job.job_registry_ca_configmap.is_none() {
        bail!(
            "--registry-ca with --job needs --job-registry-ca-configmap: the ConfigMap (key ca.crt) the Pods mount"
        );
    }
    if args.cache_redis.is_some() && job.job_cache_key_secret.is_none() {
        bail!(
            "--cache-redis with --job needs --job-cache-key-secret: the Secret (key current) the Pods mount"
        );
    }
    if access.docker_config.is_some() && job.job_docker_config_secret.is_none() {
        bail!("--docker-config with --job needs --job-docker-config-secret");
    }
    if args.shard.is_some() || args.shard_out.is_some() || args.merge.is_some() {
        bail!("--job sets --shard and --shard-out itself; --merge runs after it");
    }
    if job.job_shards == 0 {
        bail!("--job-shards must be at least 1");
    }
    Ok(())
}

/// File name → text of every policy file the audit itself loads for these paths
/// (`ivory_policy::read_policy_files`: a folder's files at any depth), so the Job judges with
/// the same policies.
fn policy_files(paths: &[PathBuf]) -> anyhow::Result<serde_json::Map<String, Value>> {
    let mut files = ivory_policy::PolicyFiles::default();
    for path in paths {
        files.merge(ivory_policy::read_policy_files(path));
    }
    if let Some(error) = files.errors.first() {
        bail!("--policy: {error}");
    }
    let mut data = serde_json::Map::new();
    let mut total = 0;
    for (file, bytes) in files.files {
        let text = String::from_utf8(bytes)
            .with_context(|| format!("--policy {}: not UTF-8", file.display()))?;
        total += text.len();
        let key = file_key(&file);
        if data.insert(key.clone(), json!(text)).is_some() {
            bail!("--job: two policy files are named {key}; rename one");
        }
    }
    if total > MAX_POLICY_BYTES {
        bail!("--job: the policy files take {total} bytes, more than a ConfigMap holds (1 MiB)");
    }
    Ok(data)
}

fn file_key(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "policy.yaml".to_owned())
}

fn labels(name: &str) -> Value {
    json!({"app.kubernetes.io/name": "ivory-audit", "app.kubernetes.io/instance": name, "app.kubernetes.io/part-of": "ivory"})
}

fn indexed_job(args: &Args, job: &JobOpts, name: &str, image: &str, claim: &str) -> Value {
    let mut mounts = vec![
        json!({"name": "policies", "mountPath": POLICIES, "readOnly": true}),
        json!({"name": "parts", "mountPath": PARTS}),
        json!({"name": "tmp", "mountPath": "/tmp"}),
    ];
    let mut volumes = vec![
        json!({"name": "policies", "configMap": {"name": format!("{name}-policies")}}),
        json!({"name": "parts", "persistentVolumeClaim": {"claimName": claim}}),
        json!({"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}),
    ];
    let mut mount = |volume: &str, path: &str, source: Value| {
        mounts.push(json!({"name": volume, "mountPath": path, "readOnly": true}));
        let mut entry = json!({"name": volume});
        if let (Some(entry), Some(source)) = (entry.as_object_mut(), source.as_object()) {
            entry.extend(source.clone());
        }
        volumes.push(entry);
    };
    if let Some(map) = &job.job_registry_ca_configmap {
        mount(
            "registry-ca",
            REGISTRY_CA,
            json!({"configMap": {"name": map}}),
        );
    }
    if let Some(secret) = &job.job_cache_key_secret {
        mount(
            "cache-key",
            CACHE_KEY,
            json!({"secret": {"secretName": secret}}),
        );
    }
    if let Some(secret) = &job.job_docker_config_secret {
        let items = json!([{"key": ".dockerconfigjson", "path": "config.json"}]);
        mount(
            "docker-config",
            DOCKER_CONFIG,
            json!({"secret": {"secretName": secret, "items": items}}),
        );
    }
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": job.job_namespace, "labels": labels(name)},
        "spec": {
            "completionMode": "Indexed",
            "completions": job.job_shards,
            "parallelism": job.job_parallelism.unwrap_or(job.job_shards),
            "backoffLimitPerIndex": job.job_backoff_limit_per_index,
            // Every shard is tried to the end: the merge names the ones that failed.
            "maxFailedIndexes": job.job_shards,
            "template": {
                "metadata": {"labels": labels(name)},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": {
                        "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                        "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "audit",
                        "image": image,
                        "args": container_args(args, job, name),
                        "env": [{"name": "HOME", "value": "/tmp"}],
                        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
                        "securityContext": {
                            "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                },
            },
        },
    })
}

/// The shard's command line: this audit's sources and options, with the mounted paths.
fn container_args(args: &Args, job: &JobOpts, name: &str) -> Vec<String> {
    let mut out: Vec<String> = vec!["audit".into(), "--policy".into(), POLICIES.into()];
    let mut flag = |name: &str, value: String| {
        out.push(format!("--{name}"));
        out.push(value);
    };
    for host in &args.registries {
        flag("registry", host.clone());
    }
    for glob in &args.repositories {
        flag("repository", glob.clone());
    }
    flag("max-images", args.max_images.to_string());
    flag("page-size", args.page_size.to_string());
    flag("concurrency", args.concurrency.to_string());
    flag("timeout", seconds(args.timeout));
    if let Some(namespace) = &args.namespace {
        flag("namespace", namespace.clone());
    }
    let access = &args.registry.access;
    for (host, mirror) in &access.mirrors {
        flag("registry-mirror", format!("{host}={mirror}"));
    }
    if access.registry_ca.is_some() {
        flag("registry-ca", format!("{REGISTRY_CA}/ca.crt"));
    }
    if access.docker_config.is_some() {
        flag("docker-config", format!("{DOCKER_CONFIG}/config.json"));
    }
    flag(
        "registry-concurrency",
        access.registry_concurrency.to_string(),
    );
    if let Some(repository) = &access.signature_repository {
        flag("signature-repository", repository.clone());
    }
    for cidr in &access.egress.egress_allow {
        flag("egress-allow", cidr.to_string());
    }
    if let Some(mode) = clap::ValueEnum::to_possible_value(&access.egress.egress_private) {
        flag("egress-private", mode.get_name().to_owned());
    }
    flag("tag-cache-ttl", seconds(args.registry.tag_cache_ttl));
    if let Some(url) = &args.cache_redis {
        flag("cache-redis", url.clone());
        flag("cache-redis-key", format!("{CACHE_KEY}/current"));
        flag("cache-redis-timeout", seconds(args.cache_redis_timeout));
    }
    flag(
        "shard",
        format!("$(JOB_COMPLETION_INDEX)/{}", job.job_shards),
    );
    flag("shard-out", format!("{PARTS}/{name}"));
    if access.insecure.allow_insecure_registry {
        out.push("--allow-insecure-registry".into());
    }
    if access.insecure.allow_http_registry {
        out.push("--allow-http-registry".into());
    }
    out
}

/// A Go duration in seconds (or milliseconds below a second).
fn seconds(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

//! What the one-shot commands (`verify`, `apply`, `audit`, `test`) share: registry flags, the
//! verifier, policy loading and input files. Judging a request on every webhook route is the
//! engine's (`ivory_engine::pipeline::run_routes`).
//! `ivory serve` takes the same registry flags ([`RegistryAccessOpts`]).

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ivory_engine::decision::Decision;
use ivory_engine::exceptions::Exceptions;
use ivory_engine::resources::{FileResources, NoResources, ResourceSource};
use ivory_l2::{DiskCache, Keys, L2Config, RedisL2};
use ivory_policy::CompiledPolicy;
use ivory_registry::{Config as RegistryConfig, DEFAULT_PER_REGISTRY_CONCURRENCY, Registry};
use ivory_server::budget::parse_go_duration;
use ivory_verify::{CosignVerifier, SharedCache, VerifierConfig};
use serde_json::Value;

/// How every command reaches registries: trust, credentials, concurrency, insecure registries
/// (`ivory serve` and the one-shot commands alike).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct RegistryAccessOpts {
    /// Fetch images of registry HOST from MIRROR instead (`ghcr.io=127.0.0.1:5000`;
    /// repeatable). Image names, policy globs and the cache keep HOST; digests and
    /// signatures are checked as for HOST. For air-gapped clusters and CI with mirrored images.
    #[arg(long = "registry-mirror", value_name = "HOST=MIRROR", value_parser = mirror)]
    pub mirrors: Vec<(String, String)>,
    /// Extra CA certificates (PEM) trusted for registries.
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Option<PathBuf>,
    /// Docker config.json whose `auths` are used for registries.
    #[arg(long, value_name = "FILE")]
    pub docker_config: Option<PathBuf>,
    /// Most requests in flight to any one registry host at a time.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PER_REGISTRY_CONCURRENCY)]
    pub registry_concurrency: NonZeroUsize,
    #[command(flatten)]
    pub insecure: InsecureOpts,
    #[command(flatten)]
    pub egress: EgressOpts,
    /// Repository cosign signatures, attestations and Sigstore bundles are read from, for
    /// every cosign attestor without its own `source.repository` (cosign's COSIGN_REPOSITORY,
    /// whose value is taken when the flag is not given); e.g. `ghcr.io/acme/signatures`.
    /// Default: each image's own repository.
    #[arg(long, value_name = "REPOSITORY", env = "COSIGN_REPOSITORY", value_parser = parse_signature_repository)]
    pub signature_repository: Option<String>,
}

/// Which addresses ivory connects to when a request, a registry or a certificate chooses the
/// host: registries, redirect targets, token realms, CRL distribution points, image data.
/// Judged on the address connected to, whatever the spelling or DNS answer.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct EgressOpts {
    /// An address range (ADDRESS or ADDRESS/PREFIX) connected to whatever its class: a
    /// registry on a link-local address, or loopback and private ranges under
    /// `--egress-private deny`. Repeatable. Link-local (169.254.0.0/16, fe80::/10), cloud
    /// metadata (fd00:ec2::254, ...), unspecified, multicast, broadcast and reserved
    /// addresses are refused otherwise, in any IPv6 form.
    #[arg(long = "egress-allow", value_name = "CIDR")]
    pub egress_allow: Vec<ivory_registry::Cidr>,
    /// Loopback and private addresses (127/8, ::1, 10/8, 172.16/12, 192.168/16, 100.64/10,
    /// fc00::/7): allowed by default, since in-cluster registries and mirrors live there and
    /// the kubelet pulls from them too; `deny` refuses them unless `--egress-allow` names them.
    #[arg(long, value_enum, value_name = "MODE", default_value = "allow")]
    pub egress_private: EgressPrivate,
}

/// `--egress-private`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum EgressPrivate {
    /// Connect to loopback and private addresses.
    #[default]
    Allow,
    /// Refuse them unless `--egress-allow` names them.
    Deny,
}

impl EgressOpts {
    /// The egress rule these flags give.
    pub(crate) fn rule(&self) -> ivory_registry::EgressRule {
        ivory_registry::EgressRule {
            allow: self.egress_allow.clone(),
            private: match self.egress_private {
                EgressPrivate::Allow => ivory_registry::PrivateNetworks::Allow,
                EgressPrivate::Deny => ivory_registry::PrivateNetworks::Deny,
            },
        }
    }
}

/// clap parser for `--signature-repository`: a repository name without tag or digest, kept
/// in its full spelling (`index.docker.io/acme/sigs` for `acme/sigs`); empty (an empty
/// COSIGN_REPOSITORY, which cosign ignores) stays empty and means none.
fn parse_signature_repository(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Ok(String::new());
    }
    let parsed = ivory_registry::parse_reference(text)
        .map_err(|e| format!("{text:?} is not a repository: {e}"))?;
    if parsed.original_tag().is_some() || parsed.digest().is_some() {
        return Err(format!(
            "{text:?} names a tag or digest; give the repository alone"
        ));
    }
    Ok(parsed.repository_name().to_owned())
}

impl RegistryAccessOpts {
    /// The repository `--signature-repository` (or COSIGN_REPOSITORY) names; `None` when unset
    /// or empty.
    pub(crate) fn signature_repository(&self) -> Option<String> {
        self.signature_repository.clone().filter(|r| !r.is_empty())
    }

    /// The registry client configuration these flags give; a named file that cannot be read
    /// is an error naming its flag.
    pub(crate) fn config(&self) -> anyhow::Result<RegistryConfig> {
        let ca_bundle_pem = match &self.registry_ca {
            Some(path) => Some(
                std::fs::read(path)
                    .with_context(|| format!("reading --registry-ca {}", path.display()))?,
            ),
            None => None,
        };
        if let Some(path) = &self.docker_config {
            std::fs::metadata(path)
                .with_context(|| format!("reading --docker-config {}", path.display()))?;
        }
        let mut config = RegistryConfig {
            ca_bundle_pem,
            docker_config: self.docker_config.clone(),
            per_registry_concurrency: self.registry_concurrency,
            egress: self.egress.rule(),
            mirrors: self.mirrors.iter().cloned().collect(),
            ..RegistryConfig::default()
        };
        self.insecure.apply(&mut config);
        Ok(config)
    }
}

/// The one-shot commands' registry flags: access, the tag cache and the persistent cache.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct RegistryOpts {
    #[command(flatten)]
    pub access: RegistryAccessOpts,
    /// How long a tag's resolved digest is reused (Go duration; 0s disables the cache). Longer
    /// spares registries a herd of lookups for popular tags; shorter notices a moved tag
    /// sooner. Never reused across credential sets.
    #[arg(long, value_name = "DURATION", default_value = TAG_CACHE_TTL, value_parser = duration)]
    pub tag_cache_ttl: Duration,
    #[command(flatten)]
    pub cache: CacheOpts,
}

/// The persistent verification cache of the one-shot commands (`ivory_l2::DiskCache`).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct CacheOpts {
    /// Folder of the persistent verification cache: verdicts by digest and policy/trust hash
    /// (as `ivory serve` keys them), resolved tags for --tag-cache-ttl, sealed with a per-user
    /// key (a file edited by hand is ignored). Default: $XDG_CACHE_HOME/ivory, else
    /// ~/.cache/ivory.
    #[arg(long, value_name = "DIR", env = "IVORY_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Run without the persistent cache (every verification asks the registry).
    #[arg(long, env = "IVORY_NO_CACHE")]
    pub no_cache: bool,
    /// Most bytes the cache's files may take; the oldest entries go first.
    #[arg(long, value_name = "BYTES", default_value_t = ivory_l2::disk::DEFAULT_MAX_BYTES)]
    pub cache_max_size: u64,
}

impl CacheOpts {
    /// The cache, or `None` (said once on stderr) when it is off or its folder is unusable:
    /// a cache is never needed to answer.
    pub(crate) fn open(&self) -> Option<Arc<dyn SharedCache>> {
        if self.no_cache {
            return None;
        }
        let Some(dir) = self.cache_dir.clone().or_else(DiskCache::default_dir) else {
            tracing::warn!(
                "no cache folder (no --cache-dir, XDG_CACHE_HOME or HOME): running without the verification cache"
            );
            return None;
        };
        match DiskCache::open(&dir, self.cache_max_size) {
            Ok(cache) => Some(Arc::new(cache)),
            Err(e) => {
                tracing::warn!(error = %e, "running without the verification cache");
                None
            }
        }
    }
}

/// Registries without (verified) TLS, with cosign's and crane's flag names. Loopback
/// registries (`localhost`, `127.0.0.1`, `::1`) get the plain-HTTP fallback without a flag,
/// as go-containerregistry gives it; a policy's `credentials.allowInsecureRegistry` allows
/// both for its own images.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub(crate) struct InsecureOpts {
    /// Accept any TLS certificate from registries and fall back to plain HTTP when TLS fails.
    #[arg(long)]
    pub allow_insecure_registry: bool,
    /// Fall back to plain HTTP when TLS to a registry fails (certificates are still checked
    /// when TLS works).
    #[arg(long)]
    pub allow_http_registry: bool,
}

impl InsecureOpts {
    /// Sets these flags on a registry configuration.
    pub(crate) fn apply(self, config: &mut RegistryConfig) {
        config.allow_insecure = self.allow_insecure_registry;
        config.allow_http = self.allow_http_registry;
    }
}

/// Default of `--tag-cache-ttl` (as `VerifierConfig::tag_ttl`).
pub(crate) const TAG_CACHE_TTL: &str = "30s";

impl RegistryOpts {
    /// The registry client configuration of [`RegistryAccessOpts::config`].
    pub(crate) fn config(&self) -> anyhow::Result<RegistryConfig> {
        self.access.config()
    }

    /// The cosign verifier over a registry client built from these flags, behind the
    /// persistent cache unless it is off.
    pub(crate) fn verifier(&self) -> anyhow::Result<CosignVerifier> {
        verifier_for(
            self.config()?,
            self.tag_cache_ttl,
            self.access.signature_repository(),
            self.cache.open(),
        )
    }
}

/// The cosign verifier over a registry client with `config`, reusing resolved tags for
/// `tag_ttl`, reading signatures from `signature_repository` when given, behind `cache` when
/// given.
pub(crate) fn verifier_for(
    config: RegistryConfig,
    tag_ttl: Duration,
    signature_repository: Option<String>,
    cache: Option<Arc<dyn SharedCache>>,
) -> anyhow::Result<CosignVerifier> {
    let registry = Registry::new(config).context("creating registry client")?;
    Ok(CosignVerifier::with_shared_cache(
        registry,
        VerifierConfig {
            tag_ttl,
            revocation_settle: Some(ONE_SHOT_REVOCATION_WAIT),
            signature_repository,
            ..VerifierConfig::default()
        },
        CosignVerifier::anonymous_credentials(),
        cache,
    ))
}

/// A cosign verifier over an existing registry client (sharing its connections and limits)
/// that reads with `credentials` (a Pod's pull secrets, say) plus each policy's
/// `allowInsecureRegistry`, behind `cache` when given (tags are named per credential set
/// there, so what one set of pull secrets saw never answers for another).
pub(crate) fn verifier_with_credentials(
    registry: Registry,
    tag_ttl: Duration,
    signature_repository: Option<String>,
    credentials: ivory_registry::Credentials,
    cache: Option<Arc<dyn SharedCache>>,
) -> CosignVerifier {
    CosignVerifier::with_shared_cache(
        registry,
        VerifierConfig {
            tag_ttl,
            revocation_settle: Some(ONE_SHOT_REVOCATION_WAIT),
            signature_repository,
            ..VerifierConfig::default()
        },
        Arc::new(move |c: Option<&ivory_policy::types::Credentials>| {
            credentials
                .clone()
                .allow_insecure(c.and_then(|c| c.allow_insecure_registry).unwrap_or(false))
        }),
        cache,
    )
}

/// How long a one-shot command (verify, apply, audit, test) waits for the CRLs a Notation
/// chain names before judging it (`ivory serve` never waits: its admissions are judged on the
/// data already fetched).
pub(crate) const ONE_SHOT_REVOCATION_WAIT: Duration = Duration::from_secs(10);

/// clap parser for counts that must be at least 1.
pub(crate) fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{text:?} is not a whole number of at least 1")),
    }
}

/// clap parser for Go durations (`30s`, `1m30s`): the one every command's duration flag uses,
/// over `ivory_server::budget::parse_go_duration` (whose oracle is Go's own parser).
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    parse_go_duration(text).ok_or_else(|| format!("{text:?} is not a duration like 30s or 1m30s"))
}

/// Loads every policy file or folder; any load error fails with the file it came from.
pub(crate) fn load_policies(paths: &[PathBuf]) -> anyhow::Result<Vec<Arc<CompiledPolicy>>> {
    let mut report = ivory_policy::LoadReport::default();
    for path in paths {
        if !path.exists() {
            bail!("--policy {}: no such file or directory", path.display());
        }
        report.merge(ivory_policy::load_path(path));
    }
    finish_load(report, "--policy")
}

/// Loads `--exception` files (PolicyExceptions, acted on as with Kyverno's CLI `--exception`);
/// `None` without any. Any load error fails with the file it came from.
pub(crate) fn load_exceptions(paths: &[PathBuf]) -> anyhow::Result<Option<Exceptions>> {
    if paths.is_empty() {
        return Ok(None);
    }
    let mut report = ivory_policy::LoadReport::default();
    for path in paths {
        if !path.exists() {
            bail!("--exception {}: no such file or directory", path.display());
        }
        report.merge(ivory_policy::load_path(path));
    }
    if !report.errors.is_empty() {
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        bail!(
            "invalid policy exceptions (--exception):\n  {}",
            errors.join("\n  ")
        );
    }
    if report.exceptions.is_empty() {
        bail!("--exception: no PolicyException found");
    }
    Ok(Some(Exceptions {
        exceptions: Arc::new(report.exceptions.into_iter().map(Arc::new).collect()),
        namespace: None,
    }))
}

/// Turns a load report into policies, or an error listing every problem.
pub(crate) fn finish_load(
    report: ivory_policy::LoadReport,
    what: &str,
) -> anyhow::Result<Vec<Arc<CompiledPolicy>>> {
    for note in &report.skipped {
        tracing::info!("{note}");
    }
    if !report.errors.is_empty() {
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        bail!("invalid policies ({what}):\n  {}", errors.join("\n  "));
    }
    if report.policies.is_empty() {
        bail!("{what}: no ImageValidatingPolicy found");
    }
    Ok(report.policies.into_iter().map(Arc::new).collect())
}

/// Applies the mutating stage's `replace` operations to `object`.
pub(crate) fn apply_patch(object: &mut Value, decision: &Decision) -> anyhow::Result<()> {
    for op in &decision.patch {
        let slot = object
            .pointer_mut(&op.path)
            .with_context(|| format!("patch path {} is not in the resource", op.path))?;
        *slot = Value::String(op.value.clone());
    }
    Ok(())
}

/// Reads a file, or stdin for `-`.
/// Largest cluster resource file read (`--cluster-resources`).
const MAX_CLUSTER_RESOURCE_FILE: u64 = 64 * 1024 * 1024;

/// The objects of `--cluster-resources` files and folders (YAML or JSON, several documents,
/// `kind: List`, GlobalContextEntries), for the policies' `resource.*` / `globalContext.*`
/// calls; none given: such calls fail (the policies' failurePolicy decides).
pub(crate) fn load_cluster_resources(paths: &[PathBuf]) -> anyhow::Result<Arc<dyn ResourceSource>> {
    if paths.is_empty() {
        return Ok(Arc::new(NoResources));
    }
    let mut documents = Vec::new();
    for path in paths {
        let files = if path.is_dir() {
            let (files, errors) = ivory_policy::policy_files(path);
            if let Some(e) = errors.first() {
                bail!("--cluster-resources {}: {e}", path.display());
            }
            files
        } else {
            vec![path.clone()]
        };
        for file in files {
            let flag = format!("--cluster-resources {}", file.display());
            let opened = std::fs::File::open(&file).with_context(|| format!("reading {flag}"))?;
            let text = read_bounded(opened, &flag, MAX_CLUSTER_RESOURCE_FILE)?;
            let docs =
                ivory_policy::documents(&text).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
            documents.extend(docs.into_iter().filter(|d| !d.is_null()));
        }
    }
    let files = FileResources::new(documents).context("--cluster-resources")?;
    tracing::debug!(objects = files.len(), "cluster resources loaded");
    Ok(Arc::new(files))
}

/// The text `reader` holds, refused past `max` bytes (read no further than that) or when it
/// is not UTF-8; errors name `origin`. The one bounded read of the commands' input files.
pub(crate) fn read_bounded(
    reader: impl std::io::Read,
    origin: &str,
    max: u64,
) -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    reader
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {origin}"))?;
    if bytes.len() as u64 > max {
        bail!("{origin}: larger than {max} bytes");
    }
    String::from_utf8(bytes).with_context(|| format!("{origin}: not UTF-8"))
}

pub(crate) fn read_input(path: &std::path::Path, flag: &str) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .with_context(|| format!("reading {flag} from stdin"))?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {flag} {}", path.display()))
}

#[cfg(test)]
mod parity;

/// `HOST=MIRROR`; HOST as image references name it (lower case; Docker Hub's names are
/// `index.docker.io`, the host go-containerregistry and ivory give its images).
fn mirror(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((from, to))
            if !from.is_empty() && !to.is_empty() && !from.contains('/') && !to.contains('/') =>
        {
            let from = from.to_ascii_lowercase();
            let from = match from.as_str() {
                "docker.io" | "registry-1.docker.io" => {
                    ivory_reference::DEFAULT_REGISTRY.to_owned()
                }
                _ => from,
            };
            Ok((from, to.to_owned()))
        }
        _ => Err(format!(
            "{text:?} is not HOST=MIRROR (e.g. ghcr.io=127.0.0.1:5000)"
        )),
    }
}

/// The L2 for `url`, sealed with the keys in `key_files` (the first seals, a second one is
/// still accepted while the fleet rotates), each call bounded by `timeout`; a `rediss://`
/// server's certificate may come from the CA in `ca_file`.
pub(crate) fn connect_redis(
    url: &str,
    key_files: &[PathBuf],
    timeout: Duration,
    ca_file: Option<&Path>,
) -> anyhow::Result<Arc<RedisL2>> {
    if key_files.is_empty() {
        bail!(
            "--cache-redis needs --cache-redis-key FILE: an HMAC key (at least {} bytes) shared \
             by the replicas, so that an entry written by anyone else is never trusted",
            ivory_l2::MIN_KEY_BYTES
        );
    }
    let mut keys = Vec::with_capacity(key_files.len());
    for path in key_files {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading --cache-redis-key {}", path.display()))?;
        // Secrets mounted from files often end with a newline that is not part of the key.
        let trimmed = bytes.trim_ascii_end().to_vec();
        keys.push((format!("--cache-redis-key {}", path.display()), trimmed));
    }
    let keys = Keys::new(&keys)?;
    if timeout.is_zero() {
        bail!("--cache-redis-timeout must be more than 0s");
    }
    let mut config = L2Config::new(url, keys);
    config.deadline = timeout;
    if let Some(path) = ca_file {
        config.ca_pem = Some(
            std::fs::read(path)
                .with_context(|| format!("reading --cache-redis-ca {}", path.display()))?,
        );
    }
    Ok(Arc::new(RedisL2::new(config)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_engine::decision::PatchOp;
    use serde_json::json;

    #[test]
    fn mirrors_are_named_by_the_host_references_carry() {
        assert_eq!(
            mirror("GHCR.io=127.0.0.1:5000"),
            Ok(("ghcr.io".to_owned(), "127.0.0.1:5000".to_owned()))
        );
        assert_eq!(mirror("docker.io=m:5000").unwrap().0, "index.docker.io");
        for bad in [
            "ghcr.io",
            "=m",
            "ghcr.io=",
            "ghcr.io/acme=m",
            "ghcr.io=m/path",
        ] {
            assert!(mirror(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_signature_repository_is_a_repository_alone() {
        assert_eq!(
            parse_signature_repository("acme/sigs").as_deref(),
            Ok("index.docker.io/acme/sigs")
        );
        assert_eq!(
            parse_signature_repository("127.0.0.1:5000/ivory/sigs").as_deref(),
            Ok("127.0.0.1:5000/ivory/sigs")
        );
        // An empty COSIGN_REPOSITORY is no repository, as for cosign.
        assert_eq!(parse_signature_repository("").as_deref(), Ok(""));
        for bad in [
            "ghcr.io/acme/sigs:v1",
            "ghcr.io/acme/sigs@sha256:00",
            "bad repo",
            "UP/case",
        ] {
            assert!(parse_signature_repository(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn patches_replace_images() {
        let mut pod = json!({"spec": {"containers": [{"image": "a:1"}]}});
        let d = Decision {
            patch: vec![PatchOp {
                path: "/spec/containers/0/image".into(),
                value: "a:1@sha256:00".into(),
            }],
            ..Decision::default()
        };
        apply_patch(&mut pod, &d).unwrap();
        assert_eq!(pod["spec"]["containers"][0]["image"], "a:1@sha256:00");
        let bad = Decision {
            patch: vec![PatchOp {
                path: "/spec/initContainers/0/image".into(),
                value: "x".into(),
            }],
            ..Decision::default()
        };
        let err = apply_patch(&mut pod, &bad).unwrap_err().to_string();
        assert!(err.contains("/spec/initContainers/0/image"), "{err}");
    }
}

//! The stack under test: registry with pushed images, webhook TLS material, policies, and
//! starting `ivory serve` / `null-webhook` on it.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, Result};
use ivory_testkit::{HungRegistry, RegistryHarness, TestPki};

use crate::LoadArgs;
use crate::procs::{Server, free_port};
use crate::sign::{BenchKey, Image, Pusher};
use ivory_bench::policy::key_policy;

/// Parallel pushes into the registry.
const PUSH_CONCURRENCY: usize = 16;

/// Images pushed for the run.
pub(crate) struct Images {
    /// The cosign-signed fixture `ivory/sig-p256:v1` (key-p256).
    pub fixture: Image,
    /// Two synthetic images for the warm Pod (with the fixture: three containers).
    pub warm: Vec<Image>,
    /// Never requested before the cold phase: [tag-ref image, digest-ref image].
    pub cold: Vec<Image>,
    /// Requested only by the herd phase.
    pub herd: Image,
    /// Verified by both ivory and cosign, cold.
    pub cosign: Vec<Image>,
    /// Distinct images for the cache-memory phase.
    pub cached: Vec<Image>,
}

pub(crate) struct Stack {
    pub args: LoadArgs,
    pub work: PathBuf,
    pub registry: ivory_testkit::Harness,
    pub hung: HungRegistry,
    pub images: Images,
    pub client: reqwest::Client,
    pub bench_key: PathBuf,
    pub fixture_key: PathBuf,
    pub registry_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    policies: PathBuf,
}

impl Stack {
    pub(crate) async fn build(args: LoadArgs, cached: usize, cosign: usize) -> Result<Self> {
        let work = args.out.join("work");
        if work.exists() {
            std::fs::remove_dir_all(&work)
                .with_context(|| format!("clearing {}", work.display()))?;
        }
        std::fs::create_dir_all(work.join("policies"))
            .with_context(|| format!("creating {}", work.display()))?;
        let registry = RegistryHarness::start_default()
            .await
            .context("starting docker-registry")?;
        let hung = HungRegistry::start()
            .await
            .context("starting the hung registry")?;
        let pki = TestPki::generate("ivory-bench webhook CA").context("webhook PKI")?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let path = work.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        let cert = write("webhook.pem", &pki.server_chain_pem)?;
        let key = write("webhook.key", &pki.server_key_pem)?;
        let registry_ca = write("registry-ca.pem", registry.ca_pem())?;
        let signer = BenchKey::generate()?;
        let bench_key = write("bench.pub", &signer.public_pem()?)?;
        let fixture_key = args.fixtures.join("keys/cosign-p256.pub");
        let fixture_pem = std::fs::read_to_string(&fixture_key)
            .with_context(|| format!("reading {}", fixture_key.display()))?;

        let host = registry.host().to_owned();
        let policies = work.join("policies");
        let bench_pem = signer.public_pem()?;
        let docs = [
            ("bench", format!("{host}/bench/*"), &bench_pem),
            ("fixture", format!("{host}/ivory/*"), &fixture_pem),
            ("hung", format!("{}/hung/*", hung.host()), &bench_pem),
        ];
        for (name, glob, pem) in docs {
            write(
                &format!("policies/{name}.yaml"),
                &key_policy(name, &glob, pem),
            )?;
        }

        eprintln!("pushing images ({cached} cached-phase images)…");
        let images = push_images(&args, &registry, &signer, cached, cosign).await?;
        let client = crate::loadgen::client(&pki.ca_pem, 256)?;
        Ok(Self {
            args,
            work,
            registry,
            hung,
            images,
            client,
            bench_key,
            fixture_key,
            registry_ca,
            cert,
            key,
            policies,
        })
    }

    /// `ivory serve` with TLS on a fresh port.
    pub(crate) async fn start_ivory(&self, label: &str) -> Result<Server> {
        self.start_ivory_with(label, &[]).await
    }

    /// `ivory serve` with TLS on a fresh port and `extra` arguments.
    pub(crate) async fn start_ivory_with(&self, label: &str, extra: &[String]) -> Result<Server> {
        self.start_ivory_on(label, &self.policies, extra).await
    }

    /// `ivory serve` with TLS on a fresh port, the policies of `policies` and `extra` arguments.
    pub(crate) async fn start_ivory_on(
        &self,
        label: &str,
        policies: &std::path::Path,
        extra: &[String],
    ) -> Result<Server> {
        let port = free_port()?;
        let mut cmd = wrapped(&self.args.ivory);
        cmd.arg("serve")
            .arg("--policies")
            .arg(policies)
            .arg("--tls-cert")
            .arg(&self.cert)
            .arg("--tls-key")
            .arg(&self.key)
            .arg("--registry-ca")
            .arg(&self.registry_ca)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            // The allocator settings deploy/ gives the Deployment.
            .env("MIMALLOC_ARENA_EAGER_COMMIT", "0")
            .env("MIMALLOC_PURGE_DELAY", "0");
        let log = self.work.join(format!("{label}.log"));
        let url = format!("https://127.0.0.1:{port}");
        Server::start(label, cmd, &log, url, "/readyz", &self.client).await
    }

    /// The null webhook with the same certificate.
    pub(crate) async fn start_null(&self) -> Result<Server> {
        let port = free_port()?;
        let bin = match &self.args.null_webhook {
            Some(p) => p.clone(),
            None => sibling("null-webhook")?,
        };
        let mut cmd = Command::new(bin);
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--tls-cert")
            .arg(&self.cert)
            .arg("--tls-key")
            .arg(&self.key);
        let log = self.work.join("null-webhook.log");
        let url = format!("https://127.0.0.1:{port}");
        Server::start("null-webhook", cmd, &log, url, "/healthz", &self.client).await
    }
}

/// `ivory`, or `$IVORY_BENCH_WRAP ivory` when that is set (a profiler, for instance
/// `valgrind --tool=callgrind --callgrind-out-file=/tmp/ivory.cg`; see BENCHMARKS.md).
fn wrapped(ivory: &std::path::Path) -> Command {
    let wrap = std::env::var("IVORY_BENCH_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(ivory);
            cmd
        }
        None => Command::new(ivory),
    }
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating ivory-bench")?;
    Ok(exe.with_file_name(name))
}

async fn push_images(
    args: &LoadArgs,
    registry: &ivory_testkit::Harness,
    signer: &BenchKey,
    cached: usize,
    cosign: usize,
) -> Result<Images> {
    let layout = args.fixtures.join("oci/ivory/sig-p256");
    let tags = registry
        .push_oci_layout(&layout, "ivory/sig-p256")
        .await
        .with_context(|| format!("pushing {}", layout.display()))?;
    let fixture = Image {
        name: format!("{}/ivory/sig-p256", registry.host()),
        tag: "v1".into(),
        digest: tags
            .get("v1")
            .cloned()
            .with_context(|| format!("{}: no tag v1", layout.display()))?,
    };
    let pusher = Pusher::new(registry.host(), registry.ca_pem())?;
    let push = async |repo: &str, n: usize| -> Result<Vec<Image>> {
        pusher
            .signed_images(repo, n, signer, PUSH_CONCURRENCY)
            .await
    };
    let warm = push("bench/warm", 2).await?;
    let cold = push("bench/cold", 2).await?;
    let herd = push("bench/herd", 1).await?.pop().context("herd image")?;
    let cosign = push("bench/cosign", cosign).await?;
    let cached = push("bench/cached", cached).await?;
    Ok(Images {
        fixture,
        warm,
        cold,
        herd,
        cosign,
        cached,
    })
}

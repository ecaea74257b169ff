//! `ivory serve`'s trusted-root flags: where the root of attestors that name no `trustedRoot`
//! comes from (`ivory_verify::TrustRoots`), how often it is refreshed, and its metrics.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ivory_registry::Registry;
use ivory_verify::{RefreshConfig, TrustRoots, TrustSource, TufSource, TufSources};

use super::super::wiring::duration;

/// Largest `--tuf-root` file (Sigstore's root.json is about 6 KiB).
const MAX_TUF_ROOT_BYTES: u64 = 512 * 1024;

/// The trusted root's source.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct TrustOpts {
    /// A Sigstore trusted_root.json for attestors that name no trustedRoot (a mounted ConfigMap
    /// or Secret), read again every --reload-interval: for sites that publish their root
    /// without TUF. A policy's own trustedRoot keeps precedence. Default: the public-good root
    /// built into ivory.
    #[arg(long, value_name = "FILE", conflicts_with = "tuf_mirror")]
    trusted_root: Option<PathBuf>,
    /// Keep that root current from a TUF repository: `public-good` (Sigstore's, its chain
    /// anchored at the root.json built into ivory) or a mirror's URL (http or https: the
    /// metadata is signed). Asked at start and every --tuf-refresh-interval, never during an
    /// admission; until it answers, the last root --tuf-cache-dir proves, else the built-in root.
    #[arg(long, value_name = "URL|public-good")]
    tuf_mirror: Option<String>,
    /// The TUF root.json the chain of a --tuf-mirror other than `public-good` starts from.
    #[arg(long, value_name = "FILE", requires = "tuf_mirror")]
    tuf_root: Option<PathBuf>,
    /// Where verified TUF metadata is kept between runs (a volume the chart mounts), so a
    /// restart with the mirror down serves the last root it proves (the repositories attestors
    /// name in `cosign.tuf` under `attestors/`); without it, memory only.
    #[arg(long, value_name = "DIR")]
    tuf_cache_dir: Option<PathBuf>,
    /// How often a TUF repository (--tuf-mirror's, and those attestors name in `cosign.tuf`)
    /// is asked for a new root (Go duration). Hourly keeps a key rotation or a new log shard
    /// under an hour behind, at two small requests when nothing changed; Sigstore re-signs its
    /// timestamp daily, so a day would let it lapse.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = duration)]
    tuf_refresh_interval: Duration,
}

impl TrustOpts {
    /// The source the flags name.
    fn source(&self) -> anyhow::Result<TrustSource> {
        if let Some(path) = &self.trusted_root {
            return Ok(TrustSource::File(path.clone()));
        }
        let Some(mirror) = &self.tuf_mirror else {
            return Ok(TrustSource::Embedded);
        };
        let anchor = match &self.tuf_root {
            Some(path) => Some(read_root(path)?),
            None => None,
        };
        let source = if mirror == "public-good" {
            let mut source = TufSource::public_good(self.tuf_cache_dir.clone());
            if let Some(root) = anchor {
                source.root = root;
            }
            source
        } else {
            let Some(root) = anchor else {
                bail!(
                    "--tuf-mirror {mirror}: --tuf-root is required with a mirror other than public-good (the root.json its chain starts from)"
                );
            };
            TufSource {
                mirror: mirror.clone(),
                root,
                cache_dir: self.tuf_cache_dir.clone(),
            }
        };
        Ok(TrustSource::Tuf(source))
    }

    /// The trusted roots, their TUF fetches through `registry`'s guarded client.
    pub(crate) fn roots(&self, registry: &Registry) -> anyhow::Result<TrustRoots> {
        let source = self.source()?;
        TrustRoots::new(source, registry, RefreshConfig::default())
            .context("the trusted root (--trusted-root, --tuf-mirror)")
    }

    /// The TUF repositories attestors name (`cosign.tuf`), fetched through `registry`'s
    /// guarded client, refreshed every --tuf-refresh-interval, cached under
    /// `--tuf-cache-dir/attestors`.
    pub(crate) fn attestor_sources(&self, registry: &Registry) -> TufSources {
        TufSources::new(
            registry.clone(),
            RefreshConfig::default(),
            self.tuf_refresh_interval,
            self.tuf_cache_dir.as_ref().map(|d| d.join("attestors")),
        )
    }

    /// How often the source is read again: a file every `reload_interval`, TUF every
    /// --tuf-refresh-interval; `None` for the built-in root.
    pub(crate) fn refresh_period(&self, reload_interval: Duration) -> Option<Duration> {
        if self.trusted_root.is_some() {
            Some(reload_interval)
        } else {
            self.tuf_mirror.as_ref().map(|_| self.tuf_refresh_interval)
        }
    }
}

fn read_root(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    let origin = format!("--tuf-root {}", path.display());
    let file = std::fs::File::open(path).with_context(|| format!("reading {origin}"))?;
    super::super::wiring::read_bounded(file, &origin, MAX_TUF_ROOT_BYTES).map(String::into_bytes)
}

/// The metrics' view of `roots`.
pub(crate) fn stats_source(roots: &TrustRoots) -> ivory_server::TrustRootStatsSource {
    let roots = roots.clone();
    Arc::new(move || {
        // The built-in root is never refreshed: nothing to say about it.
        if matches!(roots.source(), TrustSource::Embedded) {
            return Vec::new();
        }
        let stats = roots.stats();
        let current = roots.current();
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .ok()
                .and_then(|d| i64::try_from(d.as_secs()).ok())
        };
        let now = ivory_clock::wall();
        vec![ivory_server::TrustRootCount {
            source: stats.source,
            age_seconds: current
                .obtained
                .and_then(|at| now.duration_since(at).ok())
                .and_then(|d| i64::try_from(d.as_secs()).ok()),
            last_success_unix: stats.last_success.and_then(unix),
            succeeded: stats.succeeded,
            failed: stats.failed,
            last_error: stats.last_error,
        }]
    })
}

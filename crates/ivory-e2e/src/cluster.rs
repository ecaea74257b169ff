//! Starting, sharing and stopping the test cluster.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use tempfile::TempDir;
use tokio::sync::OnceCell;

use crate::{Error, Result};

/// When set, [`Cluster::shared`] uses the cluster of this kubeconfig instead of starting one
/// (e.g. one started by hand with `scripts/e2e/cluster.sh start DIR`, to rerun tests quickly).
pub const KUBECONFIG_ENV: &str = "IVORY_E2E_KUBECONFIG";

/// When set (non-empty), a started cluster's folder (certificates, etcd data, logs) is kept after
/// it stops, for looking into a failure; its path is printed.
pub const KEEP_ENV: &str = "IVORY_E2E_KEEP";

/// A kube-apiserver (with its etcd) on 127.0.0.1.
///
/// A cluster this process started is stopped on drop; should the process die first, the watchdog
/// of `cluster.sh` stops it once the process is gone.
#[derive(Debug)]
pub struct Cluster {
    kubeconfig: PathBuf,
    owned: Option<Owned>,
}

#[derive(Debug)]
struct Owned {
    path: PathBuf,
    /// Removes the folder on drop; `None` once kept.
    dir: Option<TempDir>,
    script: PathBuf,
}

static SHARED: OnceCell<Cluster> = OnceCell::const_new();

impl Cluster {
    /// Starts a new cluster (a few seconds once the binaries are built).
    pub async fn start() -> Result<Self> {
        Self::start_with(None).await
    }

    /// [`Self::start`] with the API server reading `admission_config` (an
    /// `AdmissionConfiguration`, e.g. the static webhook manifests' of `ivory webhooks --static`)
    /// through `--admission-control-config-file`.
    pub async fn start_with_admission_config(admission_config: &Path) -> Result<Self> {
        Self::start_with(Some(admission_config)).await
    }

    async fn start_with(admission_config: Option<&Path>) -> Result<Self> {
        let script = cluster_script();
        let dir = tempfile::Builder::new()
            .prefix("ivory-e2e-")
            .tempdir()
            .map_err(Error::TempDir)?;
        let mut command = tokio::process::Command::new("bash");
        command
            .arg(&script)
            .arg("start")
            .arg(dir.path())
            .env("IVORY_E2E_OWNER_PID", std::process::id().to_string())
            .stdin(std::process::Stdio::null());
        if let Some(config) = admission_config {
            command.env("IVORY_E2E_ADMISSION_CONFIG", config);
        }
        let output = command.output().await.map_err(|source| Error::Spawn {
            script: script.clone(),
            source,
        })?;
        if !output.status.success() {
            let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&output.stderr));
            if keep_dir() {
                text.push_str(&format!(
                    "\n(cluster folder kept: {})",
                    dir.keep().display()
                ));
            }
            return Err(Error::Start {
                script,
                status: output.status,
                output: text,
            });
        }
        Ok(Self {
            kubeconfig: dir.path().join("kubeconfig"),
            owned: Some(Owned {
                path: dir.path().to_owned(),
                dir: Some(dir),
                script,
            }),
        })
    }

    /// One cluster for the whole test process, started by the first caller, or the one named
    /// by [`KUBECONFIG_ENV`]. Tests sharing it keep apart by working in their own namespaces
    /// ([`crate::create_namespace`]).
    pub async fn shared() -> Result<&'static Self> {
        SHARED
            .get_or_try_init(|| async {
                match std::env::var_os(KUBECONFIG_ENV) {
                    Some(path) => Ok(Self {
                        kubeconfig: PathBuf::from(path),
                        owned: None,
                    }),
                    None => Self::start().await,
                }
            })
            .await
    }

    /// A client with cluster-admin rights (system:masters).
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig =
            Kubeconfig::read_from(&self.kubeconfig).map_err(|source| Error::Kubeconfig {
                path: self.kubeconfig.clone(),
                source,
            })?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: self.kubeconfig.clone(),
                    source,
                })?;
        kube::Client::try_from(config).map_err(|source| Error::Client {
            path: self.kubeconfig.clone(),
            source,
        })
    }

    /// The admin kubeconfig of this cluster.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The folder holding this cluster's certificates and logs, for a cluster this process started.
    pub fn dir(&self) -> Option<&Path> {
        self.owned.as_ref().map(|owned| owned.path.as_path())
    }

    /// The API server's audit events so far (`audit.log`: Metadata level for Pods), one JSON
    /// object each; empty for a cluster started by hand.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        let Some(text) = self
            .dir()
            .and_then(|d| std::fs::read_to_string(d.join("audit.log")).ok())
        else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The last `lines` lines of the API server's log (for failure messages), if this process
    /// started the cluster.
    pub fn apiserver_log_tail(&self, lines: usize) -> Option<String> {
        let log = std::fs::read_to_string(self.dir()?.join("kube-apiserver.log")).ok()?;
        let all: Vec<&str> = log.lines().collect();
        Some(all[all.len().saturating_sub(lines)..].join("\n"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(owned) = &mut self.owned {
            // Blocking is fine here: stopping takes well under a second unless a process hangs,
            // and the script bounds that wait.
            let _ = std::process::Command::new("bash")
                .arg(&owned.script)
                .arg("stop")
                .arg(&owned.path)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            if keep_dir()
                && let Some(dir) = owned.dir.take()
            {
                eprintln!(
                    "ivory-e2e: kept the cluster folder {}",
                    dir.keep().display()
                );
            }
        }
    }
}

fn keep_dir() -> bool {
    std::env::var_os(KEEP_ENV).is_some_and(|value| !value.is_empty())
}

fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/e2e/cluster.sh")
}

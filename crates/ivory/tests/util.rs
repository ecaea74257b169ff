//! Running `ivory` as a process: TLS material, startup (the bound address comes from the
//! `listening` log line), HTTPS clients that trust only the test CA, and review builders.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ivory_testkit::{TestPki, fixtures_dir};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ivory");

/// A CA plus a 127.0.0.1 server certificate, written to `dir`.
pub(crate) struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca_pem: String,
}

impl Tls {
    pub(crate) fn write(dir: &Path, name: &str) -> Self {
        let pki = TestPki::generate(name).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, &pki.server_chain_pem).unwrap();
        std::fs::write(&key, &pki.server_key_pem).unwrap();
        Self {
            cert,
            key,
            ca_pem: pki.ca_pem,
        }
    }
}

/// A running `ivory serve`; killed on drop.
pub(crate) struct Ivory {
    pub child: Child,
    /// Shared, so requests reuse one connection like the API server does.
    client: reqwest::Client,
    pub addr: SocketAddr,
    pub ca_pem: String,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Ivory {
    /// Starts `ivory serve --listen 127.0.0.1:0 --tls-cert … --tls-key … <extra>`.
    pub(crate) async fn start(tls: &Tls, extra: &[String]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--reload-interval",
            "300ms",
        ])
        .arg("--tls-cert")
        .arg(&tls.cert)
        .arg("--tls-key")
        .arg(&tls.key)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = oneshot::channel();
        let sink = logs.clone();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && v["fields"]["message"] == "listening"
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(v["fields"]["addr"].as_str().unwrap_or("").to_owned());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(addr)) => addr.parse().unwrap(),
            _ => panic!("ivory did not start: {}", logs.lock().unwrap().join("\n")),
        };
        Self {
            child,
            client: Self::client_for(&tls.ca_pem),
            addr,
            ca_pem: tls.ca_pem.clone(),
            logs,
        }
    }

    /// Starts `ivory serve` with `extra` arguments and a new test CA (and server certificate)
    /// written to `dir`.
    pub(crate) async fn start_in(dir: &Path, extra: &[String]) -> Self {
        Self::start(&Tls::write(dir, "ivory test CA"), extra).await
    }

    /// Starts `ivory serve --policies <policies>` (no registry CA) with a new test CA in `dir`.
    pub(crate) async fn start_policies(dir: &Path, policies: &Path) -> Self {
        Self::start_in(dir, &["--policies".into(), policies.display().to_string()]).await
    }

    /// Starts `ivory serve --policies <policies>` with a new test CA in `dir`, trusting the
    /// registry CA the caller wrote to `dir/registry-ca.pem`.
    pub(crate) async fn start_with_policies(dir: &Path, policies: &Path) -> Self {
        let tls = Tls::write(dir, "ivory test CA");
        Self::start(
            &tls,
            &[
                "--policies".into(),
                policies.display().to_string(),
                "--registry-ca".into(),
                dir.join("registry-ca.pem").display().to_string(),
            ],
        )
        .await
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// A fresh client (no pooled connections) trusting only `ca_pem`.
    pub(crate) fn client_for(ca_pem: &str) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap();
        reqwest::Client::builder()
            .tls_certs_only([ca])
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap()
    }

    pub(crate) fn client(&self) -> reqwest::Client {
        self.client.clone()
    }

    pub(crate) fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// The logs once they stop growing for a moment (at most 2 s): a server busy with many
    /// admissions at once writes its log in batches, up to a millisecond after the last answer.
    pub(crate) async fn settled_logs(&self) -> String {
        let deadline = ivory_clock::now() + Duration::from_secs(2);
        let mut seen = self.logs.lock().unwrap().len();
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = self.logs.lock().unwrap().len();
            if now == seen || ivory_clock::now() >= deadline {
                return self.logs();
            }
            seen = now;
        }
    }

    /// POSTs `body` and returns the status and the raw body.
    pub(crate) async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
        let resp = self
            .client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    /// POSTs a review and returns `response` (asserting a 200 AdmissionReview).
    pub(crate) async fn review(&self, path: &str, review: &Value) -> Value {
        let (status, text) = self.post(path, review.to_string()).await;
        assert_eq!(status, 200, "{path}: {text}\n{}", self.logs());
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["kind"], "AdmissionReview", "{text}");
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1", "{text}");
        assert_eq!(v["response"]["uid"], review["request"]["uid"], "{text}");
        v["response"].clone()
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        let resp = self.client().get(self.url(path)).send().await.unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    pub(crate) async fn metrics(&self) -> String {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, 200);
        text
    }
}

pub(crate) use ivory_testkit::review::pod_review;

/// Asserts that the admission response `resp` denies, with a message containing `reason`.
#[track_caller]
pub(crate) fn assert_denied(resp: &Value, reason: &str) {
    assert_eq!(resp["allowed"], false, "{resp}");
    let message = resp["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(reason), "{resp}");
}

/// A new empty `policies` folder in `dir`.
pub(crate) fn policies_dir(dir: &Path) -> PathBuf {
    let policies = dir.join("policies");
    std::fs::create_dir(&policies).unwrap();
    policies
}

/// An ImageValidatingPolicy for pods whose images match `glob`.
pub(crate) use ivory_testkit::policy::pod_policy as policy;

/// `attestors:` with the fixture P-256 key (signatures without transparency log).
pub(crate) fn key_attestor() -> String {
    let pem = std::fs::read_to_string(fixtures_dir().join("keys/cosign-p256.pub")).unwrap();
    ivory_testkit::policy::key_attestor_yaml(&pem)
}

/// Kyverno's verification check and message.
pub(crate) const VERIFY_SIGNED: &str = "  validations:
    - expression: >-
        images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)
      message: failed the image Signature verification
";

/// Peak resident set of `pid` in KiB (`VmHWM`).
pub(crate) fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

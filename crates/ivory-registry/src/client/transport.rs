//! How one call reaches the registry: client per credential set, concurrency gate,
//! deadline, 429/503 retries, plain-HTTP fallback and the one-time auth probe.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::token_cache::RegistryTokenType;
use oci_client::{Client, RegistryOperation};
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout_at};

use super::{Registry, Target};
use crate::auth::Credentials;
use crate::error::{Error, Result};
use crate::stats::{Counters, StatusClass};

/// First retry delay after a 429/503; doubles per attempt.
const RETRY_BASE: Duration = Duration::from_millis(100);
/// Longest single retry delay.
const RETRY_CAP: Duration = Duration::from_secs(2);
/// Attempts per call, whatever the deadline.
const MAX_ATTEMPTS: u32 = 8;

/// One oci-client per credential set: oci-client keeps the first auth it sees per
/// registry (oras-project/rust-oci-client#221), so clients must never be shared across creds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ClientKey {
    host: String,
    auth: AuthKey,
    insecure: bool,
    plain_http: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum AuthKey {
    Anonymous,
    Basic(String, String),
    Bearer(String),
}

impl From<&RegistryAuth> for AuthKey {
    fn from(a: &RegistryAuth) -> Self {
        match a {
            RegistryAuth::Anonymous => AuthKey::Anonymous,
            RegistryAuth::Basic(u, p) => AuthKey::Basic(u.clone(), p.clone()),
            RegistryAuth::Bearer(t) => AuthKey::Bearer(t.clone()),
        }
    }
}

// === impl Registry ===

impl Registry {
    /// Runs `f` under the host's concurrency cap and the deadline, retrying 429/503 while
    /// the deadline allows, and falling back to plain HTTP for insecure credentials.
    pub(super) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        t: &Target,
        creds: &Credentials,
        deadline: Instant,
        f: F,
    ) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let budget = deadline.saturating_duration_since(Instant::now());
        let counters = self.inner.stats.for_host(&t.host);
        let gate = self.gate(&t.host);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let plain = self.is_plain_http(&t.host, creds);
            let built = self
                .client(t, creds.allow_insecure, plain, deadline, || {
                    t.site().deadline(op, budget)
                })
                .await;
            let client = match built {
                Ok(c) => c,
                Err(e) => {
                    counters.error();
                    return Err(e);
                }
            };
            let res = self
                .attempt(
                    op,
                    t,
                    deadline,
                    budget,
                    &counters,
                    &gate,
                    &client,
                    f(client.clone()),
                )
                .await;
            let err = match res {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if creds.allow_insecure && !plain && matches!(err, Error::Transport { .. }) {
                // Kyverno's allowInsecureRegistry: TLS failed, so try plain HTTP once.
                self.mark_plain_http(&t.host, true);
                continue;
            }
            if plain && matches!(err, Error::Transport { .. }) {
                // Plain HTTP failed too: try TLS first again next time (the host may be back).
                self.mark_plain_http(&t.host, false);
            }
            let Some(status) = err.retry_status() else {
                if matches!(err, Error::Unauthorized { .. }) {
                    // The host may have started challenging; probe again next time.
                    self.forget_probe(&t.host).await;
                }
                counters.error();
                return Err(err);
            };
            counters.throttled();
            let delay = backoff(attempts);
            if attempts < MAX_ATTEMPTS && Instant::now() + delay < deadline {
                tracing::debug!(registry = %t.host, image = %t.image, status, attempts, ?delay, "retrying");
                tokio::time::sleep(delay).await;
                continue;
            }
            counters.error();
            return Err(Error::Throttled {
                image: t.image.clone(),
                registry: t.host.clone(),
                status,
                attempts,
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn attempt<T>(
        &self,
        op: &'static str,
        t: &Target,
        deadline: Instant,
        budget: Duration,
        counters: &Counters,
        gate: &Arc<Semaphore>,
        client: &Client,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        // Errors are counted once, by `call`.
        let deadline_err = || t.site().deadline(op, budget);
        let _permit = match timeout_at(deadline, gate.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => {
                return Err(Error::Config {
                    detail: "registry concurrency gate closed".into(),
                });
            }
            Err(_) => return Err(deadline_err()),
        };
        // The permit can arrive exactly at the deadline; do not start a doomed request.
        if Instant::now() >= deadline {
            return Err(deadline_err());
        }
        if self
            .skip_ping(client, t, deadline, counters)
            .await
            .is_none()
        {
            return Err(deadline_err());
        }
        counters.request();
        let started = Instant::now();
        let res = timeout_at(deadline, fut).await;
        counters.latency(started.elapsed());
        let res = res.unwrap_or_else(|_| Err(deadline_err()));
        counters.status(match &res {
            Ok(_) => StatusClass::Success,
            Err(e) => e.status_class(),
        });
        res
    }

    /// oci-client pings `/v2/` before every request for which it cached no token, and it
    /// caches none for anonymous access or for hosts that do not challenge. Probe each host
    /// once (through oci-client's own auth flow); for hosts without a Bearer challenge, seed
    /// the token cache with the Basic login (empty when anonymous), which open registries
    /// ignore and Basic-challenging ones check as they would after a ping.
    /// `None` when the deadline passed during the probe.
    async fn skip_ping(
        &self,
        client: &Client,
        t: &Target,
        deadline: Instant,
        counters: &Counters,
    ) -> Option<()> {
        let login = match &t.auth {
            RegistryAuth::Anonymous => (String::new(), String::new()),
            RegistryAuth::Basic(u, p) => (u.clone(), p.clone()),
            RegistryAuth::Bearer(_) => return Some(()),
        };
        // Concurrent cold calls to one host share one probe (moka runs one init per key;
        // if its caller gives up, a waiting caller runs the probe again).
        let probe = async {
            counters.request();
            match client
                .auth(&t.reference, &t.auth, RegistryOperation::Pull)
                .await
            {
                Ok(None) => {
                    // 200, or a Basic challenge: oci-client does not say which.
                    counters.status(StatusClass::Success);
                    Ok(true)
                }
                Ok(Some(_)) => {
                    // 401 with a Bearer challenge, then a token.
                    counters.status(StatusClass::Client);
                    Ok(false)
                }
                Err(e) => {
                    counters.status(t.site().classify(e).status_class());
                    Err(())
                }
            }
        };
        let open = match timeout_at(
            deadline,
            self.inner.probes.try_get_with(t.host.clone(), probe),
        )
        .await
        {
            Ok(Ok(open)) => open,
            // Failures surface from the real request that follows; nothing is remembered.
            Ok(Err(_)) => false,
            Err(_) => return None,
        };
        if open {
            client
                .tokens
                .insert(
                    &t.reference,
                    RegistryOperation::Pull,
                    RegistryTokenType::Basic(login.0, login.1),
                )
                .await;
        }
        Some(())
    }

    /// Forgets what the auth probe learnt about `host`, so the next call probes again.
    pub(super) async fn forget_probe(&self, host: &str) {
        self.inner.probes.invalidate(host).await;
    }

    pub(super) fn gate(&self, host: &str) -> Arc<Semaphore> {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates
            .entry(host.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.inner.config.per_registry_concurrency)))
            .clone()
    }

    pub(super) fn is_plain_http(&self, host: &str, creds: &Credentials) -> bool {
        creds.allow_insecure
            && self
                .inner
                .plain_http
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(host)
    }

    fn mark_plain_http(&self, host: &str, plain: bool) {
        let mut hosts = self
            .inner
            .plain_http
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if plain {
            hosts.insert(host.to_string());
        } else {
            hosts.remove(host);
        }
    }

    /// The client for `t`'s host and credentials. Building one loads root certificates
    /// (~0.6 s in debug builds), so it runs on the blocking pool, once per key however many
    /// calls want it at the same time; each caller waits no longer than its deadline.
    pub(super) async fn client(
        &self,
        t: &Target,
        insecure: bool,
        plain_http: bool,
        deadline: Instant,
        deadline_err: impl FnOnce() -> Error,
    ) -> Result<Client> {
        let key = ClientKey {
            host: t.host.clone(),
            auth: AuthKey::from(&t.auth),
            insecure,
            plain_http,
        };
        if let Some(c) = self.inner.clients.get(&key).await {
            return Ok(c);
        }
        let roots = self.inner.roots.clone();
        let connect_timeout = self.inner.config.connect_timeout;
        let user_agent = self.inner.user_agent;
        let host = t.host.clone();
        let build = async move {
            tokio::task::spawn_blocking(move || {
                let config =
                    client_config(&roots, insecure, plain_http, connect_timeout, user_agent);
                Client::try_from(config).map_err(|e| Error::Config {
                    detail: format!("building registry client for {host}: {e}"),
                })
            })
            .await
            .map_err(|e| Error::Config {
                detail: format!("building registry client: {e}"),
            })?
        };
        match timeout_at(deadline, self.inner.clients.try_get_with(key, build)).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(Error::Config {
                detail: e.to_string(),
            }),
            Err(_) => Err(deadline_err()),
        }
    }
}

pub(super) fn client_config(
    roots: &[Vec<u8>],
    insecure: bool,
    plain_http: bool,
    connect_timeout: Duration,
    user_agent: &'static str,
) -> ClientConfig {
    ClientConfig {
        protocol: if plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        accept_invalid_certificates: insecure,
        // Exactly these anchors: no per-client read of the system store (see `roots`).
        tls_certs_only: crate::roots::trust_anchors(roots)
            .map(|der| Certificate {
                encoding: CertificateEncoding::Der,
                data: der.to_vec(),
            })
            .collect(),
        // We pick platforms ourselves (fetch_platform_manifest).
        platform_resolver: None,
        connect_timeout: Some(connect_timeout),
        user_agent,
        ..ClientConfig::default()
    }
}

pub(super) fn backoff(attempt: u32) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(10);
    RETRY_BASE.saturating_mul(factor).min(RETRY_CAP)
}

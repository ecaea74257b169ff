//! How one call reaches the registry: concurrency gate, deadline, 429/503 retries and the
//! plain-HTTP fallback for registries the policy allows to be insecure.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout_at};

use super::http::build_client;
use super::session::Conn;
use super::{Registry, Target};
use crate::auth::Credentials;
use crate::cause::TransportCause;
use crate::config::is_loopback_host;
use crate::error::{Error, Result, Site};
use crate::operation::Operation;
use crate::stats::{Counters, StatusClass};

/// First retry delay after a 429/503; doubles per attempt.
const RETRY_BASE: Duration = Duration::from_millis(100);
/// Longest single retry delay.
const RETRY_CAP: Duration = Duration::from_secs(2);
/// Attempts per call, whatever the deadline.
const MAX_ATTEMPTS: u32 = 8;

// === impl Registry ===

impl Registry {
    /// Runs `f` under the host's concurrency cap and the deadline, retrying 429/503 while
    /// the deadline allows, and falling back to plain HTTP for insecure credentials.
    pub(super) async fn call<T, F, Fut>(
        &self,
        op: Operation,
        t: &Target,
        creds: &Credentials,
        deadline: Instant,
        f: F,
    ) -> Result<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let budget = deadline.saturating_duration_since(ivory_clock::now());
        let site = t.site(op);
        let counters = self.inner.stats.for_host(&t.host);
        let gate = self.gate(&t.host);
        let mut attempts = 0u32;
        let insecure_tls = creds.allow_insecure || self.inner.config.allow_insecure;
        let http_allowed = self.plain_http_allowed(&t.host, creds);
        // The TLS failure that sent this call to plain HTTP: reported if plain HTTP fails
        // too, since a TLS registry answering plain HTTP with 400 would hide the real cause.
        let mut tls_error: Option<Error> = None;
        loop {
            attempts += 1;
            // A host is remembered as plain HTTP only once plain HTTP worked, so concurrent
            // calls each try TLS first until then.
            let plain = tls_error.is_some() || self.is_plain_http(&t.host, creds);
            let Some(client) = self.http_client(insecure_tls, deadline).await else {
                counters.error();
                return Err(site.deadline(budget));
            };
            let conn = Conn {
                client,
                scheme: if plain { "http" } else { "https" },
                // Plain HTTP is only ever chosen where it is allowed, credentials included.
                insecure: insecure_tls || plain,
            };
            let res = self
                .attempt(
                    t,
                    &conn,
                    site,
                    (deadline, budget),
                    &counters,
                    &gate,
                    f(conn.clone()),
                )
                .await;
            let err = match res {
                Ok(v) => {
                    if tls_error.is_some() {
                        self.mark_plain_http(&t.host, true);
                    }
                    return Ok(v);
                }
                Err(e) => e,
            };
            if http_allowed && !plain && matches!(err, Error::Transport { .. }) {
                // TLS failed where plain HTTP is allowed (Kyverno's allowInsecureRegistry,
                // --allow-http-registry, a loopback registry): try plain HTTP once.
                tracing::debug!(registry = %t.host, error = %err, "TLS failed; trying plain HTTP");
                tls_error = Some(err);
                continue;
            }
            if tls_error
                .as_ref()
                .is_some_and(|tls| speaks_no_plain_http(tls, &err))
            {
                tracing::debug!(registry = %t.host, error = %err, "plain HTTP failed too");
                counters.error();
                return Err(tls_error.take().unwrap_or(err));
            }
            if tls_error.is_some() && err.retry_status().is_none() {
                // The host answered over plain HTTP: it is a plain-HTTP registry, and this
                // answer is the one to report.
                self.mark_plain_http(&t.host, true);
            }
            if plain && matches!(err, Error::Transport { .. }) {
                // A remembered plain-HTTP host failed: try TLS first again next time.
                self.mark_plain_http(&t.host, false);
            }
            let Some(status) = err.retry_status() else {
                counters.error();
                return Err(err);
            };
            counters.throttled();
            let delay = backoff(attempts);
            if attempts < MAX_ATTEMPTS && ivory_clock::now() + delay < deadline {
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
        t: &Target,
        conn: &Conn,
        site: Site<'_>,
        (deadline, budget): (Instant, Duration),
        counters: &Counters,
        gate: &Arc<Semaphore>,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        // Errors are counted once, by `call`.
        let _permit = match timeout_at(deadline, gate.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => {
                return Err(Error::Config {
                    detail: "registry concurrency gate closed".into(),
                });
            }
            Err(_) => return Err(site.deadline(budget)),
        };
        // The permit can arrive exactly at the deadline; do not start a doomed request.
        if ivory_clock::now() >= deadline {
            return Err(site.deadline(budget));
        }
        // The host's auth probe (once per origin) is a request of its own. A failed probe
        // may be another caller's, run under that caller's deadline: the request below
        // probes again under this one's.
        if timeout_at(deadline, self.challenge(conn, t, site))
            .await
            .is_err()
        {
            return Err(site.deadline(budget));
        }
        counters.request();
        let started = ivory_clock::now();
        let res = timeout_at(deadline, fut).await;
        counters.latency(started.elapsed());
        let res = res.unwrap_or_else(|_| Err(site.deadline(budget)));
        counters.status(match &res {
            Ok(_) => StatusClass::Success,
            Err(e) => e.status_class(),
        });
        res
    }

    pub(super) fn gate(&self, host: &str) -> Arc<Semaphore> {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates
            .entry(host.to_string())
            .or_insert_with(|| {
                Arc::new(Semaphore::new(
                    self.inner.config.per_registry_concurrency.get(),
                ))
            })
            .clone()
    }

    /// Whether plain HTTP may be tried for `host` when TLS fails.
    pub(super) fn plain_http_allowed(&self, host: &str, creds: &Credentials) -> bool {
        let config = &self.inner.config;
        creds.allow_insecure
            || config.allow_insecure
            || config.allow_http
            || (config.plain_http_loopback && is_loopback_host(host))
    }

    pub(super) fn is_plain_http(&self, host: &str, creds: &Credentials) -> bool {
        self.plain_http_allowed(host, creds)
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

    /// The HTTP client: the verifying one, or the one accepting any certificate (built on
    /// first use, off the async workers: loading root certificates is slow). `None` when
    /// the deadline passed first.
    pub(super) async fn http_client(
        &self,
        insecure: bool,
        deadline: Instant,
    ) -> Option<reqwest::Client> {
        if !insecure {
            return Some(self.inner.http_secure.clone());
        }
        let (roots, config, ua) = (
            self.inner.roots.clone(),
            self.inner.config.clone(),
            self.inner.user_agent,
        );
        let init = self.inner.http_insecure.get_or_try_init(|| async move {
            tokio::task::spawn_blocking(move || build_client(&roots, true, &config, ua))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        });
        match timeout_at(deadline, init).await {
            Ok(Ok(c)) => Some(c.clone()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "building the insecure registry client");
                None
            }
            Err(_) => None,
        }
    }
}

/// Whether the plain-HTTP attempt `plain`, made after `tls` failed, shows that the host does
/// not speak plain HTTP: no connection, or the 400 a TLS server answers to plain HTTP (when
/// the TLS failure itself came from a TLS server, not from a plain one).
fn speaks_no_plain_http(tls: &Error, plain: &Error) -> bool {
    let tls_server = match tls {
        Error::Transport { cause, .. } => *cause != TransportCause::PeerNotTls,
        _ => false,
    };
    match plain {
        Error::Transport { .. } => true,
        Error::Rejected {
            status: Some(400), ..
        } => tls_server,
        _ => false,
    }
}

pub(super) fn backoff(attempt: u32) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(10);
    RETRY_BASE.saturating_mul(factor).min(RETRY_CAP)
}

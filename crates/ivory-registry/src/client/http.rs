//! ivory's own HTTP layer for registry answers: every body is streamed under a hard cap.
//!
//! oci-client reads every body whole (`bytes()`, `text()`) before any limit can be checked,
//! and offers no hook to wrap its reqwest client or set its redirect policy, so a hostile
//! registry could make it buffer an endless manifest, error body or token answer. Requests
//! that read a body therefore go through the reqwest clients built here: bodies are read
//! chunk by chunk against a per-response cap and a per-[`Registry`](super::Registry) budget
//! shared by every response being read, and redirects are capped and never downgrade TLS.

use std::sync::Arc;

use reqwest::redirect::{Attempt, Policy};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use ivory_reference::EgressRule;

use crate::cause::{AddressRefused, RedirectRefusal};
use crate::client::resolve::{GuardedResolver, judge_literal};
use crate::config::Config;

/// Redirects followed per request. Registries redirect blob downloads to a CDN once;
/// reqwest drops `Authorization` whenever the origin (scheme, host or port) changes.
pub(crate) const MAX_REDIRECTS: usize = 3;
/// Error bodies are read this far, for the log only.
pub(crate) const ERROR_SNIPPET_BYTES: usize = 1024;
/// Token endpoint answers larger than this are refused (tokens are a few KiB).
pub(crate) const MAX_TOKEN_BYTES: usize = 64 * 1024;

/// Why a capped body read stopped.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// The body (or its `Content-Length`) passed the cap.
    TooLarge,
    /// Every byte of the shared read budget is held by other responses.
    BudgetExhausted,
    /// The connection failed mid-body.
    Transport(reqwest::Error),
}

/// Bytes of registry bodies being read at once, across all calls of one `Registry`.
#[derive(Clone)]
pub(crate) struct ReadBudget {
    bytes: Arc<Semaphore>,
}

impl ReadBudget {
    pub(crate) fn new(total: usize) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// Takes `n` bytes of budget now or fails: waiting could deadlock readers that each hold
    /// part of the budget, and a refusal is a transient error that is never cached.
    fn take(&self, n: usize) -> Result<OwnedSemaphorePermit, BodyError> {
        let n = u32::try_from(n).map_err(|_| BodyError::TooLarge)?;
        self.bytes
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| BodyError::BudgetExhausted)
    }
}

/// Reads `resp`'s body, aborting as soon as it would pass `limit` bytes. Memory held is
/// charged to `budget` while the read lasts. A body of announced length is read into one
/// buffer of that size; otherwise chunks are kept as received (no reallocation copies, so
/// an aborted read never held more than it received) and joined at the end.
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    limit: usize,
    budget: &ReadBudget,
) -> Result<Vec<u8>, BodyError> {
    let announced = resp.content_length().and_then(|n| usize::try_from(n).ok());
    if announced.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge);
    }
    let mut held = Held::default();
    let mut chunks = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    if let Some(n) = announced.filter(|n| *n > 0) {
        held.add(budget.take(n)?);
        buf.reserve_exact(n);
    }
    let mut total = 0usize;
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Transport)? {
        total = total.saturating_add(chunk.len());
        if total > limit {
            return Err(BodyError::TooLarge);
        }
        if total <= buf.capacity() {
            buf.extend_from_slice(&chunk);
        } else {
            held.add(budget.take(chunk.len())?);
            chunks.push(chunk);
        }
    }
    if chunks.is_empty() {
        return Ok(buf);
    }
    held.add(budget.take(total)?);
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&buf);
    drop(buf);
    for chunk in chunks {
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Budget held by one read, returned when the read ends.
#[derive(Default)]
struct Held(Option<OwnedSemaphorePermit>);

impl Held {
    fn add(&mut self, more: OwnedSemaphorePermit) {
        match self.0.as_mut() {
            Some(p) => p.merge(more),
            None => self.0 = Some(more),
        }
    }
}

/// The start of an error body, lossily decoded, for the log. Never part of an error's
/// message: a registry's words must not reach an admission response.
pub(crate) async fn error_snippet(mut resp: reqwest::Response) -> String {
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < ERROR_SNIPPET_BYTES {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = ERROR_SNIPPET_BYTES - buf.len();
                buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// A reqwest client with the configured trust, timeouts and ivory's redirect policy.
pub(crate) fn build_client(
    roots: &[Vec<u8>],
    insecure: bool,
    config: &Config,
    user_agent: &'static str,
) -> Result<reqwest::Client, reqwest::Error> {
    let certs = crate::roots::trust_anchors(roots)
        .map(reqwest::Certificate::from_der)
        .collect::<Result<Vec<_>, _>>()?;
    let rule = Arc::new(config.egress.clone());
    let resolver_rule = rule.clone();
    reqwest::Client::builder()
        .danger_accept_invalid_certs(insecure)
        .tls_certs_only(certs)
        .connect_timeout(config.connect_timeout)
        .user_agent(user_agent)
        .redirect(Policy::custom(move |attempt| redirect(&rule, attempt)))
        .dns_resolver(GuardedResolver::new(resolver_rule))
        .build()
}

/// At most [`MAX_REDIRECTS`] hops, only to http(s), never from TLS to plain HTTP, and never to
/// an address literal the egress rule refuses (a name is judged by the resolver).
fn redirect(rule: &EgressRule, attempt: Attempt<'_>) -> reqwest::redirect::Action {
    let from_tls = attempt
        .previous()
        .last()
        .is_some_and(|u| u.scheme() == "https");
    let scheme = attempt.url().scheme().to_owned();
    if attempt.previous().len() > MAX_REDIRECTS {
        attempt.error(RedirectRefusal::TooMany)
    } else if scheme != "https" && scheme != "http" {
        attempt.error(RedirectRefusal::NotHttp)
    } else if from_tls && scheme == "http" {
        attempt.error(RedirectRefusal::Downgrade)
    } else if let Err(refusal) = judge_literal(rule, attempt.url()) {
        attempt.error(AddressRefused::new(refusal.ip.to_string(), refusal))
    } else {
        attempt.follow()
    }
}

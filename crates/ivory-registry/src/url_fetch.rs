//! One bounded GET of a URL ivory did not choose (a CRL distribution point named in a
//! certificate), with the registry client's guards: `http`/`https` only, no credentials, no
//! redirects, the registry client's egress rule (names judged on the resolver's answer, a
//! literal address before any connection), the body streamed under a cap and a budget shared
//! by every fetch of one [`UrlFetcher`], and a deadline on the whole exchange.

use std::sync::Arc;

use ivory_reference::{EgressRefusal, EgressRule};

use reqwest::redirect::Policy;
use tokio::time::{Instant, timeout_at};

use crate::client::http::{BodyError, ReadBudget, read_capped};
use crate::client::resolve::{GuardedResolver, judge_literal};
use crate::config::Config;

/// Why a [`UrlFetcher::get`] brought nothing back. Never carries the server's words.
#[derive(Debug, thiserror::Error)]
pub enum UrlFetchError {
    /// The URL does not parse or is not `http`/`https`.
    #[error("{0:?} is not an http(s) URL")]
    NotHttp(String),
    /// The URL names (or its host resolves only to) an address the egress rule refuses.
    #[error("the URL's host is refused: {0}")]
    AddressRefused(EgressRefusal),
    /// The server answered with another status than 200.
    #[error("the server answered HTTP {0}")]
    Status(u16),
    /// The body passed the cap, or the shared budget of bytes being read was spent.
    #[error("the answer is larger than {0} bytes (or the read budget is spent)")]
    TooLarge(usize),
    /// The deadline passed.
    #[error("no answer within the deadline")]
    Timeout,
    /// Connecting or reading failed.
    #[error("the request failed: {0}")]
    Transport(String),
}

/// A client for [`UrlFetcher::get`]; cheap to clone.
#[derive(Clone)]
pub struct UrlFetcher {
    client: reqwest::Client,
    budget: ReadBudget,
    rule: Arc<EgressRule>,
}

impl UrlFetcher {
    /// A fetcher trusting the system roots and `extra_roots` (DER), with `config`'s connect
    /// timeout and user agent; at most `budget_bytes` of bodies are held at once.
    pub(crate) fn new(
        config: &Config,
        extra_roots: &[Vec<u8>],
        budget_bytes: usize,
    ) -> Result<Self, UrlFetchError> {
        let certs = crate::roots::trust_anchors(extra_roots)
            .map(reqwest::Certificate::from_der)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| UrlFetchError::Transport(e.to_string()))?;
        let rule = Arc::new(config.egress.clone());
        let client = reqwest::Client::builder()
            .tls_certs_only(certs)
            .connect_timeout(config.connect_timeout)
            .user_agent(config.user_agent.clone())
            .redirect(Policy::none())
            .dns_resolver(GuardedResolver::new(rule.clone()))
            .build()
            .map_err(|e| UrlFetchError::Transport(e.to_string()))?;
        Ok(Self {
            client,
            budget: ReadBudget::new(budget_bytes),
            rule,
        })
    }

    /// The body of `url` (HTTP 200 only), at most `limit` bytes, by `deadline`.
    pub async fn get(
        &self,
        url: &str,
        limit: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, UrlFetchError> {
        let parsed = checked_url(url)?;
        judge_literal(&self.rule, &parsed).map_err(UrlFetchError::AddressRefused)?;
        let exchange = async {
            let resp = self
                .client
                .get(parsed)
                .send()
                .await
                .map_err(|e| transport(&e))?;
            if resp.status() != reqwest::StatusCode::OK {
                return Err(UrlFetchError::Status(resp.status().as_u16()));
            }
            read_capped(resp, limit, &self.budget)
                .await
                .map_err(|e| match e {
                    BodyError::TooLarge | BodyError::BudgetExhausted => {
                        UrlFetchError::TooLarge(limit)
                    }
                    BodyError::Transport(e) => transport(&e),
                })
        };
        timeout_at(deadline, exchange)
            .await
            .unwrap_or(Err(UrlFetchError::Timeout))
    }
}

/// `url` parsed, if it is `http`/`https` without credentials and does not name an address
/// literally that the default egress rule refuses (the fetcher judges again by its own rule;
/// names are judged by the resolver when connected to).
pub fn checked_url(url: &str) -> Result<reqwest::Url, UrlFetchError> {
    let parsed = reqwest::Url::parse(url).map_err(|_| UrlFetchError::NotHttp(url.to_owned()))?;
    if !matches!(parsed.scheme(), "http" | "https")
        || !parsed.username().is_empty()
        || parsed.password().is_some()
    {
        return Err(UrlFetchError::NotHttp(url.to_owned()));
    }
    if parsed.host().is_none() {
        return Err(UrlFetchError::NotHttp(url.to_owned()));
    }
    judge_literal(&EgressRule::default(), &parsed).map_err(UrlFetchError::AddressRefused)?;
    Ok(parsed)
}

/// A transport failure in ivory's words: the resolver's refusal keeps its own variant.
fn transport(e: &reqwest::Error) -> UrlFetchError {
    if e.is_timeout() {
        return UrlFetchError::Timeout;
    }
    if let Some(refused) = crate::cause::AddressRefused::of(e) {
        return UrlFetchError::AddressRefused(refused.refusal());
    }
    UrlFetchError::Transport(if e.is_connect() {
        "cannot connect".to_owned()
    } else {
        "the connection failed".to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_urls_to_allowed_addresses_pass() {
        assert!(checked_url("http://127.0.0.1:8080/a.crl").is_ok());
        assert!(checked_url("https://crl.example.com/a.crl").is_ok());
        for bad in [
            "ldap://ldap.example.com/cn=x",
            "file:///etc/passwd",
            "http://user:pw@example.com/a.crl",
            "not a url",
        ] {
            assert!(
                matches!(checked_url(bad), Err(UrlFetchError::NotHttp(_))),
                "{bad}"
            );
        }
        for bad in [
            "http://169.254.169.254/latest",
            "http://[fd00:ec2::254]/x",
            "http://0.0.0.0/x",
            "http://2852039166/x",
            "http://0xa9fea9fe/x",
            "http://169.254.43518/x",
            "http://[::ffff:169.254.169.254]/x",
            "http://[64:ff9b::a9fe:a9fe]/x",
        ] {
            assert!(
                matches!(checked_url(bad), Err(UrlFetchError::AddressRefused(_))),
                "{bad}"
            );
        }
    }
}

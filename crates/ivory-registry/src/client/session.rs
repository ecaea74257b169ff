//! Authentication against a registry: one `/v2/` probe per origin learns its challenge;
//! Bearer tokens are fetched from the realm (bounded, TLS-checked) and cached per
//! repository and credential set; credentials only ever travel over TLS unless the policy
//! allows that registry to be insecure.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use tokio::time::Instant;

use super::http::{MAX_TOKEN_BYTES, error_snippet, read_capped};
use super::resolve::judge_literal;
use super::{Registry, Target};
use crate::auth::RegistryAuth;
use crate::error::{EgressVia, Error, Result, Site, truncate};
use crate::stats::{Counters, StatusClass};

/// Token lifetime when the realm does not say (the distribution spec's default).
const DEFAULT_TOKEN_SECS: u64 = 60;
/// Longest we keep a token, whatever the realm says.
const MAX_TOKEN_SECS: u64 = 3600;
/// Tokens are dropped this long before they expire, so none expires in flight.
const TOKEN_MARGIN: Duration = Duration::from_secs(5);

/// How one call reaches a registry: the HTTP client and scheme, and whether the policy
/// allows this registry to be insecure (plain HTTP, unverified TLS).
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) client: reqwest::Client,
    pub(crate) scheme: &'static str,
    pub(crate) insecure: bool,
}

impl Conn {
    /// `scheme://host/v2/<path>`.
    pub(crate) fn url(&self, host: &str, path: &str) -> String {
        format!("{}://{host}/v2/{path}", self.scheme)
    }

    fn origin(&self, host: &str) -> String {
        format!("{}://{host}", self.scheme)
    }

    /// Credentials go over TLS, or over plain HTTP only to a registry the policy marks
    /// insecure.
    fn may_send_credentials(&self, url: &Url) -> bool {
        url.scheme() == "https" || self.insecure
    }
}

/// What a registry's `/v2/` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// 200: no authentication.
    Open,
    /// 401 with a Basic (or unparseable) challenge: send the login as Basic.
    Basic,
    /// 401 with a Bearer challenge: fetch a token from `realm`.
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// The Bearer challenge in `header`, else Basic. Parsing by `http-auth`, which oci-client
/// uses too.
fn parse_challenge(header: Option<&HeaderValue>) -> Challenge {
    let Some(text) = header.and_then(|h| h.to_str().ok()) else {
        return Challenge::Basic;
    };
    for challenge in http_auth::ChallengeParser::new(text).flatten() {
        if !challenge.scheme.eq_ignore_ascii_case("Bearer") {
            continue;
        }
        let param = |name: &str| {
            challenge
                .params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_unescaped())
        };
        if let Some(realm) = param("realm") {
            return Challenge::Bearer {
                realm,
                service: param("service"),
            };
        }
    }
    Challenge::Basic
}

/// A token cache key: origin, repository, credential set.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TokenKey {
    origin: String,
    repository: String,
    auth: RegistryAuth,
}

/// A cached Bearer token.
#[derive(Clone)]
pub(crate) struct Token {
    value: String,
    until: Instant,
}

#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

// === impl Registry ===

impl Registry {
    /// Sends `method url` with the authentication `t`'s registry asks for. A 401 forgets
    /// what was learnt about the host and ends in `Unauthorized`; other statuses are the
    /// caller's.
    pub(super) async fn send(
        &self,
        conn: &Conn,
        t: &Target,
        site: Site<'_>,
        method: Method,
        url: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::Response> {
        let url = Url::parse(url).map_err(|e| site.rejected(None, format!("bad URL: {e}")))?;
        self.judge_literal(site, EgressVia::Registry, &url)?;
        let auth = self.authorization(conn, t, site, &url).await?;
        let mut req = conn.client.request(method, url);
        if let Some(a) = accept {
            req = req.header(reqwest::header::ACCEPT, a);
        }
        if let Some(a) = auth {
            req = req.header(AUTHORIZATION, a);
        }
        let resp = req.send().await.map_err(|e| site.transport(e))?;
        if resp.status() == StatusCode::UNAUTHORIZED {
            self.forget_auth(conn, t).await;
            let snippet = error_snippet(resp).await;
            return Err(site.by_status(401, &snippet));
        }
        Ok(resp)
    }

    /// `url`'s host judged by the egress rule when it is an address literal: reqwest connects
    /// to a literal without asking the resolver, which judges names.
    fn judge_literal(&self, site: Site<'_>, via: EgressVia, url: &Url) -> Result<()> {
        judge_literal(&self.inner.config.egress, url).map_err(|refusal| site.egress(via, refusal))
    }

    /// The `Authorization` value for `url`, if the registry asks for one and may have it.
    async fn authorization(
        &self,
        conn: &Conn,
        t: &Target,
        site: Site<'_>,
        url: &Url,
    ) -> Result<Option<String>> {
        if !conn.may_send_credentials(url) {
            return Ok(None);
        }
        match (&t.auth, self.challenge(conn, t, site).await?) {
            (_, Challenge::Open) | (RegistryAuth::Anonymous, Challenge::Basic) => Ok(None),
            (RegistryAuth::Basic(u, p), Challenge::Basic) => Ok(Some(basic(u, p))),
            (_, Challenge::Bearer { realm, service }) => self
                .token(conn, t, site, &realm, service.as_deref())
                .await
                .map(|token| Some(format!("Bearer {token}"))),
        }
    }

    /// The host's challenge, probed once per origin (concurrent cold calls share the probe;
    /// failures are not remembered).
    pub(super) async fn challenge(
        &self,
        conn: &Conn,
        t: &Target,
        site: Site<'_>,
    ) -> Result<Challenge> {
        let counters = self.inner.stats.for_host(&t.host);
        let probe = self.probe(conn, t, site, &counters);
        self.inner
            .probes
            .try_get_with(conn.origin(&t.host), probe)
            .await
            .map_err(|e| clone_error(&e, site))
    }

    async fn probe(
        &self,
        conn: &Conn,
        t: &Target,
        site: Site<'_>,
        counters: &Counters,
    ) -> Result<Challenge> {
        let url = Url::parse(&conn.url(&t.host, ""))
            .map_err(|e| site.rejected(None, format!("bad URL: {e}")))?;
        self.judge_literal(site, EgressVia::Registry, &url)?;
        counters.request();
        let res = conn.client.get(url).send().await;
        let resp = match res {
            Ok(r) => r,
            Err(e) => {
                counters.status(StatusClass::NoAnswer);
                return Err(site.transport(e));
            }
        };
        let status = resp.status();
        counters.status(StatusClass::of_code(status.as_u16()));
        if status == StatusCode::UNAUTHORIZED {
            let challenge = parse_challenge(resp.headers().get(WWW_AUTHENTICATE));
            // Drain a little so the connection can be reused; the rest is dropped unread.
            let _ = error_snippet(resp).await;
            return Ok(challenge);
        }
        let snippet = error_snippet(resp).await;
        let code = status.as_u16();
        if code == 429 || status.is_server_error() {
            return Err(site.by_status(code, &snippet));
        }
        // No challenge: whatever else `/v2/` says, requests go without credentials.
        Ok(Challenge::Open)
    }

    /// A Bearer token for `t`'s repository (pull scope), cached until shortly before it
    /// expires.
    async fn token(
        &self,
        conn: &Conn,
        t: &Target,
        site: Site<'_>,
        realm: &str,
        service: Option<&str>,
    ) -> Result<String> {
        let key = TokenKey {
            origin: conn.origin(&t.host),
            repository: t.reference.repository().to_string(),
            auth: t.auth.clone(),
        };
        if let Some(tok) = self.inner.tokens.get(&key).await
            && ivory_clock::now() < tok.until
        {
            return Ok(tok.value);
        }
        let realm_url = self.realm_url(conn, t, site, realm, service)?;
        self.judge_literal(site, EgressVia::TokenRealm, &realm_url)?;
        let mut req = conn.client.get(realm_url);
        if let RegistryAuth::Basic(u, p) = &t.auth {
            req = req.header(AUTHORIZATION, basic(u, p));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| site.transport_via(e, EgressVia::TokenRealm))?;
        let status = resp.status();
        if !status.is_success() {
            let snippet = error_snippet(resp).await;
            tracing::info!(registry = %t.host, realm = %truncate(realm), %status,
                body = %truncate(&snippet), "token request refused");
            return Err(match status.as_u16() {
                code @ (400..=499) => Error::Unauthorized {
                    op: site.op,
                    image: t.image.clone(),
                    registry: t.host.clone(),
                    status: code,
                },
                code => site.by_status(code, &snippet),
            });
        }
        let body = read_capped(resp, MAX_TOKEN_BYTES, &self.inner.read_budget)
            .await
            .map_err(|e| site.body("token answer", MAX_TOKEN_BYTES, e))?;
        let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|e| {
            tracing::info!(registry = %t.host, error = %e, "token answer is not JSON");
            site.rejected(Some(status.as_u16()), "token answer is not a JSON token")
        })?;
        let value = answer
            .token
            .or(answer.access_token)
            .filter(|v| !v.is_empty() && HeaderValue::from_str(&format!("Bearer {v}")).is_ok())
            .ok_or_else(|| site.rejected(Some(status.as_u16()), "token answer has no token"))?;
        let secs = answer
            .expires_in
            .unwrap_or(DEFAULT_TOKEN_SECS)
            .min(MAX_TOKEN_SECS);
        let until = ivory_clock::now() + Duration::from_secs(secs).saturating_sub(TOKEN_MARGIN);
        self.inner
            .tokens
            .insert(
                key,
                Token {
                    value: value.clone(),
                    until,
                },
            )
            .await;
        Ok(value)
    }

    /// The realm with `scope` and `service`; a realm on plain HTTP is refused for a
    /// registry reached over TLS (it would see the credentials, or hand out tokens a
    /// network attacker chose).
    fn realm_url(
        &self,
        conn: &Conn,
        t: &Target,
        site: Site<'_>,
        realm: &str,
        service: Option<&str>,
    ) -> Result<Url> {
        let mut url = Url::parse(realm).map_err(|_| site.token_realm("not a URL"))?;
        match url.scheme() {
            "https" => {}
            "http" if conn.scheme == "http" || conn.insecure => {}
            "http" => {
                tracing::warn!(registry = %t.host, realm = %truncate(realm),
                    "plain-HTTP token realm refused for a TLS registry");
                return Err(site.token_realm("plain HTTP realm for a registry reached over TLS"));
            }
            _ => return Err(site.token_realm("not an http(s) URL")),
        }
        {
            let mut q = url.query_pairs_mut();
            q.append_pair(
                "scope",
                &format!("repository:{}:pull", t.reference.repository()),
            );
            if let Some(s) = service {
                q.append_pair("service", s);
            }
        }
        Ok(url)
    }

    /// Forgets the probe and the token `t` used, so the next call starts over.
    pub(super) async fn forget_auth(&self, conn: &Conn, t: &Target) {
        self.inner.probes.invalidate(&conn.origin(&t.host)).await;
        let key = TokenKey {
            origin: conn.origin(&t.host),
            repository: t.reference.repository().to_string(),
            auth: t.auth.clone(),
        };
        self.inner.tokens.invalidate(&key).await;
    }
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// moka shares one error among the callers that waited on a failed probe; rebuild it for
/// `site`, this caller's operation and image (the probe may have run for another image).
fn clone_error(e: &Error, site: Site<'_>) -> Error {
    let (op, image, registry) = (site.op, site.image.to_owned(), site.registry.to_owned());
    match e {
        Error::DeadlineExceeded { budget, .. } => site.deadline(*budget),
        Error::Transport { cause, detail, .. } => Error::Transport {
            op,
            image,
            registry,
            cause: *cause,
            detail: detail.clone(),
        },
        Error::NotFound { status, .. } => Error::NotFound {
            op,
            image,
            registry,
            status: *status,
        },
        Error::Server { status, .. } => Error::Server {
            op,
            image,
            registry,
            status: *status,
        },
        Error::Throttled {
            status, attempts, ..
        } => Error::Throttled {
            image,
            registry,
            status: *status,
            attempts: *attempts,
        },
        Error::RedirectRefused { reason, .. } => Error::RedirectRefused {
            op,
            image,
            registry,
            reason: *reason,
        },
        Error::EgressRefused { via, refusal, .. } => Error::EgressRefused {
            op,
            image,
            registry,
            via: *via,
            refusal: *refusal,
        },
        Error::Unauthorized { status, .. } => Error::Unauthorized {
            op,
            image,
            registry,
            status: *status,
        },
        Error::Rejected { status, detail, .. } => site.rejected(*status, detail.clone()),
        // The probe produces none of the others; their messages are ivory's own.
        other => Error::Config {
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cause::TransportCause;
    use crate::operation::Operation;

    #[test]
    fn a_shared_probe_failure_names_each_callers_image() {
        let first = Site {
            op: Operation::ResolveDigest,
            image: "127.0.0.1:1/a:1",
            registry: "127.0.0.1:1",
        };
        let second = Site {
            op: Operation::FetchManifest,
            image: "127.0.0.1:1/b:2",
            registry: "127.0.0.1:1",
        };
        let shared = Error::Transport {
            op: first.op,
            image: first.image.into(),
            registry: first.registry.into(),
            cause: TransportCause::ConnectionRefused,
            detail: "connection refused".into(),
        };
        let msg = clone_error(&shared, second).to_string();
        assert!(
            msg.contains("127.0.0.1:1/b:2") && msg.contains("fetch_manifest"),
            "{msg}"
        );
        assert!(!msg.contains("127.0.0.1:1/a:1"), "{msg}");
    }

    #[test]
    fn bearer_challenges_are_parsed_and_anything_else_is_basic() {
        let h = HeaderValue::from_static(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="x""#,
        );
        assert_eq!(
            parse_challenge(Some(&h)),
            Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
            }
        );
        let h = HeaderValue::from_static(r#"Basic realm="Registry Realm""#);
        assert_eq!(parse_challenge(Some(&h)), Challenge::Basic);
        assert_eq!(parse_challenge(None), Challenge::Basic);
    }
}

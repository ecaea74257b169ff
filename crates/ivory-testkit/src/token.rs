//! In-process token server for Distribution's `auth: token` (the Docker Hub style flow).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use serde_json::json;

use crate::error::{Result, io};
use crate::pki::TokenSigner;

/// `issuer` the registry is configured to trust.
pub const TOKEN_ISSUER: &str = "ivory-testkit";
/// `service` (token audience) of the harness registry.
pub const TOKEN_SERVICE: &str = "ivory-test-registry";
/// Token lifetime.
pub const TOKEN_TTL_SECS: u64 = 300;

pub(crate) struct TokenState {
    pub signer: TokenSigner,
    /// `None`: anyone (anonymous included) gets a token; `Some`: only these credentials.
    pub login: Option<(String, String)>,
    pub log: Mutex<Vec<String>>,
    jti: AtomicU64,
}

impl TokenState {
    pub(crate) fn new(signer: TokenSigner, login: Option<(String, String)>) -> Self {
        Self {
            signer,
            login,
            log: Mutex::new(Vec::new()),
            jti: AtomicU64::new(0),
        }
    }

    /// Mints a token granting `scopes` (`type:name:actions`).
    pub(crate) fn mint(&self, subject: &str, scopes: &[String]) -> Result<String> {
        let now = ivory_clock::unix_seconds();
        let access: Vec<serde_json::Value> = scopes.iter().filter_map(|s| parse_scope(s)).collect();
        let claims = json!({
            "iss": TOKEN_ISSUER,
            "sub": subject,
            "aud": TOKEN_SERVICE,
            "exp": now + TOKEN_TTL_SECS,
            "nbf": now.saturating_sub(10),
            "iat": now,
            "jti": self.jti.fetch_add(1, Ordering::Relaxed).to_string(),
            "access": access,
        });
        self.signer.sign(&claims)
    }
}

/// `repository:team/app:pull,push` → access entry. Names never contain the separators' last `:`.
fn parse_scope(scope: &str) -> Option<serde_json::Value> {
    let (kind, rest) = scope.split_once(':')?;
    let (name, actions) = rest.rsplit_once(':')?;
    let actions: Vec<&str> = actions.split(',').filter(|a| !a.is_empty()).collect();
    Some(json!({"type": kind, "name": name, "actions": actions}))
}

fn basic_login(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let b64 = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

async fn token(
    State(state): State<Arc<TokenState>>,
    headers: HeaderMap,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let scopes: Vec<String> = params
        .iter()
        .filter(|(k, _)| k == "scope")
        .map(|(_, v)| v.clone())
        .collect();
    let given = basic_login(&headers);
    let subject = match (&state.login, &given) {
        (None, _) => given.as_ref().map(|g| g.0.clone()).unwrap_or_default(),
        (Some(want), Some(got)) if want == got => got.0.clone(),
        (Some(_), _) => {
            record(&state, format!("401 scope={}", scopes.join(" ")));
            return (StatusCode::UNAUTHORIZED, "bad credentials").into_response();
        }
    };
    record(&state, format!("200 scope={}", scopes.join(" ")));
    match state.mint(&subject, &scopes) {
        Ok(t) => axum::Json(json!({
            "token": t,
            "access_token": t,
            "expires_in": TOKEN_TTL_SECS,
        }))
        .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn record(state: &TokenState, line: String) {
    state
        .log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(line);
}

/// Serves `GET /token` on 127.0.0.1, over HTTPS when given a certificate; the task stops
/// when the handle is dropped.
pub(crate) struct TokenServer {
    pub addr: SocketAddr,
    pub state: Arc<TokenState>,
    tls: bool,
    task: tokio::task::JoinHandle<()>,
}

/// PEM certificate chain and key for an HTTPS token server.
pub(crate) struct TokenTls {
    pub chain_pem: String,
    pub key_pem: String,
}

impl TokenServer {
    pub(crate) async fn start(state: TokenState, tls: Option<TokenTls>) -> Result<Self> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(io("binding token server"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("token server listener"))?;
        let addr = listener.local_addr().map_err(io("token server address"))?;
        let state = Arc::new(state);
        let app = axum::Router::new()
            .route("/token", get(token))
            .with_state(state.clone());
        let task = match &tls {
            Some(t) => {
                let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
                let config = axum_server::tls_rustls::RustlsConfig::from_pem(
                    t.chain_pem.as_bytes().to_vec(),
                    t.key_pem.as_bytes().to_vec(),
                )
                .await
                .map_err(io("token server TLS config"))?;
                let server = axum_server::from_tcp_rustls(listener, config)
                    .map_err(io("token server listener"))?;
                tokio::spawn(async move {
                    let _ = server.serve(app.into_make_service()).await;
                })
            }
            None => {
                let listener = tokio::net::TcpListener::from_std(listener)
                    .map_err(io("token server listener"))?;
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                })
            }
        };
        Ok(Self {
            addr,
            state,
            tls: tls.is_some(),
            task,
        })
    }

    pub(crate) fn realm(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}/token", self.addr)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_into_access_entries() {
        assert_eq!(
            parse_scope("repository:team/app:pull,push").unwrap(),
            json!({"type":"repository","name":"team/app","actions":["pull","push"]})
        );
        assert_eq!(
            parse_scope("registry:catalog:*").unwrap()["actions"],
            json!(["*"])
        );
        assert!(parse_scope("garbage").is_none());
    }

    #[test]
    fn minted_tokens_have_three_parts_and_claims() {
        let state = TokenState::new(TokenSigner::generate().unwrap(), None);
        let t = state.mint("u", &["repository:a:pull".into()]).unwrap();
        let parts: Vec<&str> = t.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(parts[1])
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["aud"], TOKEN_SERVICE);
        assert_eq!(claims["access"][0]["name"], "a");
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(parts[2])
            .unwrap();
        assert_eq!(sig.len(), 64, "ES256 JWS signatures are r||s");
    }
}

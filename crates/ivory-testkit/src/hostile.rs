//! Hostile registries on loopback: servers that try to exhaust a client's memory, speak
//! through its error messages, send its credentials elsewhere, or lie about digests.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use futures::StreamExt as _;
use serde_json::json;

use crate::error::{Result, io};
use crate::layout::{OCI_CONFIG, OCI_INDEX, OCI_MANIFEST, sha256_digest};

/// Text every hostile body carries; it must never appear in what a client shows users.
pub const HOSTILE_SECRET: &str = "IVORY-HOSTILE-SECRET-5f1c";
/// The catalog of the hostile server: three valid names, then three outside the grammar.
pub const HOSTILE_REPOSITORIES: [&str; 6] = [
    "pages",
    "ctrl",
    "good",
    "evil\x1b]0;owned\x07",
    "x\r\nPASS   127.0.0.1/forged:v1  sha256:00",
    "Upper\u{202e}",
];
/// Tags of `ctrl` outside the grammar (besides the valid `v1`).
pub const HOSTILE_TAGS: [&str; 4] = [
    "\x1b[2Kok",
    "a\r\nPASS   forged",
    "\u{202e}gnp.exe",
    "x\u{2066}y",
];
/// Length of the invalid names of `pages`.
const LONG_NAME: usize = 4000;
/// Size of each chunk of an endless body.
const CHUNK: usize = 64 * 1024;
/// `Content-Length` announced by `hugelength` (1 GiB).
pub const HUGE_LENGTH: u64 = 1 << 30;

/// How the hostile registry's `/v2/` asks clients to authenticate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HostileAuth {
    /// `/v2/` answers 200.
    #[default]
    Open,
    /// `/v2/` answers 401 with a Basic challenge; everything else accepts any request.
    Basic,
    /// `/v2/` answers 401 with a Bearer challenge whose realm is this server's `/token`,
    /// which streams an endless answer.
    EndlessToken,
    /// `/v2/` answers 401 with a Bearer challenge whose realm is this URL (where a client
    /// should never go: a metadata address, a name resolving there).
    Realm(String),
}

/// Options for [`HostileServer::start`].
#[derive(Clone, Debug, Default)]
pub struct HostileOptions {
    /// The challenge of `/v2/`.
    pub auth: HostileAuth,
    /// `host:port` that `redirect` sends clients to (a [`CaptureServer`]).
    pub redirect_to: Option<String>,
}

/// One request the hostile server or capture server saw: method, path, and the
/// `Authorization` header it carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenRequest {
    /// HTTP method.
    pub method: String,
    /// Path (no query).
    pub path: String,
    /// `Authorization`, if sent.
    pub authorization: Option<String>,
}

/// A plain-HTTP registry on 127.0.0.1 whose repositories misbehave (tag `latest`):
/// - `good`: a valid manifest with a true `Docker-Content-Digest` (the control).
/// - `endless`: a manifest that never ends (no `Content-Length`); HEAD has no digest, so
///   resolving reads the body. Its tag list and referrers never end either.
/// - `hugelength`: a manifest announcing [`HUGE_LENGTH`] bytes and streaming them.
/// - `secret-400`, `secret-403`, `secret-404`, `secret-500`: that status with an endless
///   body starting with an OCI error envelope that holds [`HOSTILE_SECRET`].
/// - `redirect`: 307 to the same path on `redirect_to`.
/// - `redirectloop`: 302 to itself, forever.
/// - `upperdigest`, `shortdigest`, `md5digest`, `lengthdigest`: `good`'s body with a
///   `Docker-Content-Digest` of upper-case hex, too short, another algorithm, too long.
/// - `objects`: a valid manifest (true digest) of about 3.5 MiB made of tiny JSON objects,
///   which would take hundreds of MiB once parsed into a tree.
/// - `balloonatt`: `good` under any tag; its cosign attestation tag (`sha256-<hex>.att`)
///   lists one DSSE layer of about 3.5 MiB made of tiny JSON objects (`balloon_blob`).
/// - `liardigest`: `good`'s body with a well-formed digest of other content.
/// - `badrefs`: referrers whose entry has an upper-case digest.
/// - blobs: `endless` streams an endless blob; any other digest gets content that does
///   not match it.
/// - `_catalog`: [`HOSTILE_REPOSITORIES`] (`pages`, `ctrl`, `good` and names outside the
///   grammar: ESC, CR/LF and a forged table line, bidi controls, upper case), one page whose
///   `Link` names a next page on another origin.
/// - `pages`: a tag list that never ends. Each page holds exactly the `n` asked (so a client
///   that trusts full pages keeps asking), about 3.6 KiB per entry: one in ten a valid
///   128-byte tag after `last` ([`pages_tag`]), the rest ~4000-byte names outside the tag
///   grammar (ESC sequences, CR/LF, U+202E, U+2066) that differ on every page; a same-origin
///   `Link` names the next page.
/// - `ctrl`: tags `v1` and [`HOSTILE_TAGS`] (control and bidi characters).
pub struct HostileServer {
    addr: SocketAddr,
    state: Arc<HostileState>,
    task: tokio::task::JoinHandle<()>,
}

struct HostileState {
    opts: HostileOptions,
    good: Vec<u8>,
    objects: Vec<u8>,
    balloon: Vec<u8>,
    self_host: Mutex<String>,
    log: Mutex<Vec<SeenRequest>>,
}

impl HostileServer {
    /// Starts the server on 127.0.0.1 (plain HTTP).
    pub async fn start(opts: HostileOptions) -> Result<Self> {
        let config = br#"{"architecture":"amd64","os":"linux"}"#;
        let good = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(config), "size": config.len()},
            "layers": [],
        })
        .to_string()
        .into_bytes();
        let state = Arc::new(HostileState {
            opts,
            good,
            objects: tiny_objects(),
            balloon: balloon_blob(),
            self_host: Mutex::new(String::new()),
            log: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .fallback(hostile)
            .with_state(state.clone());
        let (addr, task) = serve(app).await?;
        *state.self_host.lock().unwrap_or_else(|p| p.into_inner()) = addr.to_string();
        Ok(Self { addr, state, task })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Digest of the `good` manifest (also the body of the digest-lying repositories).
    pub fn good_digest(&self) -> String {
        sha256_digest(&self.state.good)
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.state
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Records every request (and its `Authorization`) and answers 200 with a body holding
/// [`HOSTILE_SECRET`]: the target of a hostile redirect.
pub struct CaptureServer {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<SeenRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CaptureServer {
    /// Starts the server on 127.0.0.1 (plain HTTP).
    pub async fn start() -> Result<Self> {
        let log: Arc<Mutex<Vec<SeenRequest>>> = Arc::default();
        let app = axum::Router::new()
            .fallback(capture)
            .with_state(log.clone());
        let (addr, task) = serve(app).await?;
        Ok(Self { addr, log, task })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for CaptureServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(app: axum::Router) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(io("binding hostile server"))?;
    let addr = listener
        .local_addr()
        .map_err(io("hostile server address"))?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, task))
}

fn seen(method: &Method, uri: &Uri, headers: &HeaderMap) -> SeenRequest {
    SeenRequest {
        method: method.to_string(),
        path: uri.path().to_string(),
        authorization: headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    }
}

async fn capture(
    State(log): State<Arc<Mutex<Vec<SeenRequest>>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    log.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(seen(&method, &uri, &headers));
    let body = format!("{{\"captured\":\"{HOSTILE_SECRET}\"}}");
    plain(
        StatusCode::OK,
        &[(header::CONTENT_TYPE.as_str(), OCI_MANIFEST)],
        body.into_bytes(),
    )
}

async fn hostile(
    State(state): State<Arc<HostileState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    state
        .log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(seen(&method, &uri, &headers));
    if let Some(listing) = listing(uri.path(), uri.query().unwrap_or("")) {
        return listing;
    }
    route(&state, &method, uri.path())
}

/// Valid tag `i` of page `page` of `pages`: 128 bytes, ordered by page then `i`.
pub fn pages_tag(page: u64, i: usize) -> String {
    let head = format!("p{page:08}-{i:05}-");
    format!("{head}{}", "a".repeat(128 - head.len()))
}

/// The hostile listings (`_catalog`, `pages`, `ctrl`); `None` for any other path.
fn listing(path: &str, query: &str) -> Option<Response> {
    // Only `n` and our own tags are read back: no percent-decoding needed.
    let param = |k: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.to_owned())
    };
    let body = match path {
        "/v2/_catalog" => {
            let body = json!({ "repositories": HOSTILE_REPOSITORIES }).to_string();
            return Some(plain(
                StatusCode::OK,
                &[
                    (header::CONTENT_TYPE.as_str(), "application/json"),
                    (
                        "Link",
                        r#"<http://elsewhere.invalid/v2/_catalog?last=z>; rel="next""#,
                    ),
                ],
                body.into_bytes(),
            ));
        }
        "/v2/ctrl/tags/list" => {
            let tags: Vec<&str> = std::iter::once("v1").chain(HOSTILE_TAGS).collect();
            json!({ "name": "ctrl", "tags": tags })
        }
        "/v2/pages/tags/list" => {
            let n: usize = param("n")
                .and_then(|n| n.parse().ok())
                .unwrap_or(100)
                .clamp(1, 1000);
            // The page after `last`'s page (the first when `last` is not one of ours).
            let page = param("last")
                .and_then(|l| l.get(1..9).and_then(|d| d.parse::<u64>().ok()))
                .map_or(0, |p| p + 1);
            let valid = n.div_ceil(10);
            let mut tags: Vec<String> = (0..n - valid)
                .map(|i| {
                    let noise = ["\x1b[31m", "\r\nPASS  ", "\u{202e}", "\u{2066}"][i % 4];
                    let head = format!("{noise}bad-{page}-{i}-");
                    format!("{head}{}", "x".repeat(LONG_NAME - head.len()))
                })
                .collect();
            // Valid tags last: a client that takes the page's last entry as `last` moves on.
            tags.extend((0..valid).map(|i| pages_tag(page, i)));
            let body = json!({ "name": "pages", "tags": tags }).to_string();
            let next = format!(
                r#"</v2/pages/tags/list?n={n}&last={}>; rel="next""#,
                pages_tag(page, valid - 1)
            );
            return Some(plain(
                StatusCode::OK,
                &[
                    (header::CONTENT_TYPE.as_str(), "application/json"),
                    ("Link", next.as_str()),
                ],
                body.into_bytes(),
            ));
        }
        _ => return None,
    };
    Some(plain(
        StatusCode::OK,
        &[(header::CONTENT_TYPE.as_str(), "application/json")],
        body.to_string().into_bytes(),
    ))
}

/// 401 with a Bearer challenge naming `realm`.
fn bearer(realm: &str) -> Response {
    let challenge = format!(r#"Bearer realm="{realm}",service="hostile""#);
    plain(
        StatusCode::UNAUTHORIZED,
        &[("WWW-Authenticate", challenge.as_str())],
        Vec::new(),
    )
}

fn route(state: &HostileState, method: &Method, path: &str) -> Response {
    let self_host = state
        .self_host
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if path == "/v2/" || path == "/v2" {
        return match &state.opts.auth {
            HostileAuth::Open => plain(StatusCode::OK, &[], b"{}".to_vec()),
            HostileAuth::Basic => plain(
                StatusCode::UNAUTHORIZED,
                &[("WWW-Authenticate", r#"Basic realm="hostile""#)],
                Vec::new(),
            ),
            HostileAuth::EndlessToken => bearer(&format!("http://{self_host}/token")),
            HostileAuth::Realm(realm) => bearer(realm),
        };
    }
    if path == "/token" {
        return endless(StatusCode::OK, "application/json", br#"{"token":""#, None);
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return plain(StatusCode::NOT_FOUND, &[], Vec::new());
    };
    let (repo, kind, reference) = match ["/manifests/", "/blobs/", "/referrers/", "/tags/"]
        .iter()
        .find_map(|k| rest.split_once(k).map(|(r, x)| (r, *k, x)))
    {
        Some(t) => t,
        None => return plain(StatusCode::NOT_FOUND, &[], Vec::new()),
    };
    match kind {
        "/manifests/" => manifest(state, method, &self_host, repo, path),
        "/blobs/" if repo == "balloonatt" && reference == sha256_digest(&state.balloon) => plain(
            StatusCode::OK,
            &[("Docker-Content-Digest", reference)],
            state.balloon.clone(),
        ),
        "/blobs/" => blob(repo, reference),
        "/referrers/" => referrers(repo),
        _ if repo == "endless" => {
            endless(StatusCode::OK, "application/json", br#"{"tags":["#, None)
        }
        _ => plain(StatusCode::NOT_FOUND, &[], Vec::new()),
    }
}

fn manifest(
    state: &HostileState,
    method: &Method,
    self_host: &str,
    repo: &str,
    path: &str,
) -> Response {
    let good = state.good.clone();
    let with_digest = |digest: String| {
        let body = if method == Method::HEAD {
            Vec::new()
        } else {
            good.clone()
        };
        plain(
            StatusCode::OK,
            &[
                (header::CONTENT_TYPE.as_str(), OCI_MANIFEST),
                ("Docker-Content-Digest", digest.as_str()),
            ],
            body,
        )
    };
    match repo {
        "good" => with_digest(sha256_digest(&good)),
        "balloonatt" if path.ends_with(".att") => {
            let body = balloon_att_manifest(&state.balloon);
            let digest = sha256_digest(&body);
            plain(
                StatusCode::OK,
                &[
                    (header::CONTENT_TYPE.as_str(), OCI_MANIFEST),
                    ("Docker-Content-Digest", digest.as_str()),
                ],
                if method == Method::HEAD {
                    Vec::new()
                } else {
                    body
                },
            )
        }
        "balloonatt" if path.contains("/manifests/sha256-") => {
            plain(StatusCode::NOT_FOUND, &[], Vec::new())
        }
        "balloonatt" => with_digest(sha256_digest(&good)),
        "endless" if method == Method::HEAD => plain(
            StatusCode::OK,
            &[(header::CONTENT_TYPE.as_str(), OCI_MANIFEST)],
            Vec::new(),
        ),
        "endless" => endless(
            StatusCode::OK,
            OCI_MANIFEST,
            br#"{"schemaVersion":2,"pad":""#,
            None,
        ),
        "hugelength" => endless(
            StatusCode::OK,
            OCI_MANIFEST,
            br#"{"schemaVersion":2,"pad":""#,
            Some(HUGE_LENGTH),
        ),
        "secret-400" | "secret-403" | "secret-404" | "secret-500" => {
            let code = repo
                .trim_start_matches("secret-")
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::BAD_REQUEST);
            let start =
                format!(r#"{{"errors":[{{"code":"DENIED","message":"{HOSTILE_SECRET}","detail":""#);
            endless(code, "application/json", start.as_bytes(), None)
        }
        "redirect" => {
            let to = state.opts.redirect_to.as_deref().unwrap_or(self_host);
            let location = format!("http://{to}{path}");
            plain(
                StatusCode::TEMPORARY_REDIRECT,
                &[(header::LOCATION.as_str(), location.as_str())],
                Vec::new(),
            )
        }
        "redirectloop" => {
            let location = format!("http://{self_host}{path}");
            plain(
                StatusCode::FOUND,
                &[(header::LOCATION.as_str(), location.as_str())],
                Vec::new(),
            )
        }
        "upperdigest" => with_digest(
            sha256_digest(&good)
                .to_uppercase()
                .replace("SHA256", "sha256"),
        ),
        "shortdigest" => with_digest("sha256:abc".to_string()),
        "md5digest" => with_digest(format!("md5:{}", "a".repeat(32))),
        "lengthdigest" => with_digest(format!("{}0", sha256_digest(&good))),
        "liardigest" => with_digest(sha256_digest(b"other content")),
        "objects" => {
            let digest = sha256_digest(&state.objects);
            let body = if method == Method::HEAD {
                Vec::new()
            } else {
                state.objects.clone()
            };
            plain(
                StatusCode::OK,
                &[
                    (header::CONTENT_TYPE.as_str(), OCI_MANIFEST),
                    ("Docker-Content-Digest", digest.as_str()),
                ],
                body,
            )
        }
        _ => plain(StatusCode::NOT_FOUND, &[], Vec::new()),
    }
}

/// A manifest whose `layers` are ~450k one-key objects (~3.5 MiB).
fn tiny_objects() -> Vec<u8> {
    let mut body =
        format!(r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{}},"layers":["#)
            .into_bytes();
    for i in 0..450_000 {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(br#"{"a":0}"#);
    }
    body.extend_from_slice(b"]}");
    body
}

/// A DSSE layer blob of about 3.5 MiB that is one JSON array of tiny objects: well inside
/// the signature size limits, hundreds of MiB once parsed into a tree.
fn balloon_blob() -> Vec<u8> {
    let mut body = b"[".to_vec();
    for i in 0..450_000 {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(br#"{"a":0}"#);
    }
    body.push(b']');
    body
}

/// A cosign `.att` manifest whose one DSSE layer is `blob`.
fn balloon_att_manifest(blob: &[u8]) -> Vec<u8> {
    let config = b"{}";
    json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.dsse.envelope.v1+json",
                    "digest": sha256_digest(blob), "size": blob.len()}],
    })
    .to_string()
    .into_bytes()
}

fn blob(repo: &str, digest: &str) -> Response {
    if repo == "endless" {
        return endless(StatusCode::OK, "application/octet-stream", b"", None);
    }
    plain(
        StatusCode::OK,
        &[("Docker-Content-Digest", digest)],
        format!("not the content of {digest}").into_bytes(),
    )
}

fn referrers(repo: &str) -> Response {
    match repo {
        "endless" => endless(
            StatusCode::OK,
            OCI_INDEX,
            br#"{"schemaVersion":2,"manifests":["#,
            None,
        ),
        "badrefs" => {
            let body = json!({
                "schemaVersion": 2, "mediaType": OCI_INDEX,
                "manifests": [{"mediaType": OCI_MANIFEST, "size": 10,
                    "digest": format!("sha256:{}", "A".repeat(64)),
                    "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json"}],
            });
            plain(
                StatusCode::OK,
                &[(header::CONTENT_TYPE.as_str(), OCI_INDEX)],
                body.to_string().into_bytes(),
            )
        }
        _ => plain(StatusCode::NOT_FOUND, &[], Vec::new()),
    }
}

fn plain(status: StatusCode, headers: &[(&str, &str)], body: Vec<u8>) -> Response {
    let mut b = Response::builder()
        .status(status)
        .header(header::CONTENT_LENGTH, body.len());
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// `start`, then `x` forever (or until `length` bytes), in [`CHUNK`]-sized chunks.
fn endless(status: StatusCode, content_type: &str, start: &[u8], length: Option<u64>) -> Response {
    let filler = Bytes::from(vec![b'x'; CHUNK]);
    let first = Bytes::copy_from_slice(start);
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(first) }).chain(
        futures::stream::repeat_with(move || Ok::<_, std::io::Error>(filler.clone())),
    );
    let mut b = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type);
    if let Some(n) = length {
        b = b.header(header::CONTENT_LENGTH, n);
    }
    b.body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

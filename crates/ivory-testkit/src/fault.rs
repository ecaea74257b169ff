//! Loopback servers for faults a real registry cannot produce on demand.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::json;

use crate::error::{Result, io};
use crate::layout::{OCI_CONFIG, OCI_INDEX, OCI_MANIFEST, sha256_digest};
use crate::registry::LoggedRequest;

/// Nesting of the `deep` repository's index chain.
pub const DEEP_LEVELS: usize = 6;

/// Repositories served by [`FaultServer`] (tag `latest` and by digest):
/// - `good`: a normal image manifest and its config blob.
/// - `throttled`: answers 429 + `Retry-After: 1` to the first N manifest requests, then as `good`.
/// - `unavailable`: always 503.
/// - `big`: a valid manifest larger than the configured size.
/// - `bigblob`: `good`'s manifest, but its config blob is large.
/// - `loop`: an index whose only child is its own "digest" (content cannot match it).
/// - `deep`: indexes nested [`DEEP_LEVELS`] deep over `good`'s manifest.
/// - `wrongdigest`: `good`'s manifest with a false `Docker-Content-Digest`.
/// - `nodigest`: `good`'s manifest without `Docker-Content-Digest`.
/// - `unknowntype`: a manifest whose `mediaType` is not an OCI/Docker manifest type.
/// - `malformed`: a body that is not JSON.
pub struct FaultServer {
    addr: SocketAddr,
    state: Arc<FaultState>,
    task: tokio::task::JoinHandle<()>,
}

struct Entry {
    body: Vec<u8>,
    media_type: String,
    digest_header: Option<String>,
}

struct FaultState {
    manifests: Manifests,
    blobs: HashMap<String, Vec<u8>>,
    throttle_remaining: AtomicUsize,
    log: Mutex<Vec<LoggedRequest>>,
    digests: HashMap<&'static str, String>,
}

/// Options for [`FaultServer::start`].
#[derive(Clone, Debug)]
pub struct FaultOptions {
    /// How many manifest requests to `throttled` get 429 before it answers.
    pub throttle_count: usize,
    /// Size of the `big` manifest.
    pub big_manifest_bytes: usize,
    /// Size of `bigblob`'s config blob.
    pub big_blob_bytes: usize,
}

impl Default for FaultOptions {
    fn default() -> Self {
        Self {
            throttle_count: 2,
            big_manifest_bytes: 5 * 1024 * 1024,
            big_blob_bytes: 2 * 1024 * 1024,
        }
    }
}

impl FaultServer {
    /// Starts the server on 127.0.0.1 (plain HTTP).
    pub async fn start(opts: FaultOptions) -> Result<Self> {
        let state = Arc::new(build_state(&opts));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io("binding fault server"))?;
        let addr = listener.local_addr().map_err(io("fault server address"))?;
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, state, task })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Digest of a named item: `good` (manifest), `good-config`, `loop-self`, `deep`,
    /// `bigblob-config`, `throttled`.
    pub fn digest(&self, name: &str) -> Option<&str> {
        self.state.digests.get(name).map(String::as_str)
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.state
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn entry(body: Vec<u8>, media_type: &str, header: bool) -> Arc<Entry> {
    let digest_header = header.then(|| sha256_digest(&body));
    Arc::new(Entry {
        body,
        media_type: media_type.to_string(),
        digest_header,
    })
}

type Manifests = HashMap<(String, String), Arc<Entry>>;

/// Serves `e` under tag `latest` and under its content digest.
fn put(manifests: &mut Manifests, repo: &str, e: Arc<Entry>) -> String {
    let d = sha256_digest(&e.body);
    manifests.insert((repo.to_string(), "latest".to_string()), e.clone());
    manifests.insert((repo.to_string(), d.clone()), e);
    d
}

fn build_state(opts: &FaultOptions) -> FaultState {
    let mut manifests: Manifests = HashMap::new();
    let mut blobs = HashMap::new();
    let mut digests = HashMap::new();

    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let config_digest = sha256_digest(config);
    blobs.insert(config_digest.clone(), config.to_vec());
    let good_body = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config.len()},
        "layers": [],
    })
    .to_string()
    .into_bytes();
    let good = put(
        &mut manifests,
        "good",
        entry(good_body.clone(), OCI_MANIFEST, true),
    );
    digests.insert("good", good.clone());
    digests.insert("good-config", config_digest);
    put(
        &mut manifests,
        "throttled",
        entry(good_body.clone(), OCI_MANIFEST, true),
    );
    put(
        &mut manifests,
        "nodigest",
        entry(good_body.clone(), OCI_MANIFEST, false),
    );
    let wrong = Arc::new(Entry {
        body: good_body.clone(),
        media_type: OCI_MANIFEST.to_string(),
        digest_header: Some(format!("sha256:{}", "f".repeat(64))),
    });
    put(&mut manifests, "wrongdigest", wrong);

    // Padding in an annotation keeps the big manifest valid JSON.
    let pad = "x".repeat(opts.big_manifest_bytes);
    let big = json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(config), "size": config.len()},
        "layers": [], "annotations": {"pad": pad},
    });
    put(
        &mut manifests,
        "big",
        entry(big.to_string().into_bytes(), OCI_MANIFEST, true),
    );

    let big_blob = vec![b'z'; opts.big_blob_bytes];
    let big_blob_digest = sha256_digest(&big_blob);
    blobs.insert(big_blob_digest.clone(), big_blob.clone());
    digests.insert("bigblob-config", big_blob_digest.clone());
    let bigblob = json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": big_blob_digest, "size": big_blob.len()},
        "layers": [],
    });
    put(
        &mut manifests,
        "bigblob",
        entry(bigblob.to_string().into_bytes(), OCI_MANIFEST, true),
    );

    // An index cannot contain its own digest; the server serves the same body for it.
    let self_digest = sha256_digest(b"ivory-testkit loop");
    let loop_body = json!({
        "schemaVersion": 2, "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_INDEX, "digest": self_digest, "size": 200,
                       "platform": {"os": "linux", "architecture": "amd64"}}],
    })
    .to_string()
    .into_bytes();
    let loop_entry = entry(loop_body, OCI_INDEX, true);
    put(&mut manifests, "loop", loop_entry.clone());
    manifests.insert(("loop".to_string(), self_digest.clone()), loop_entry);
    digests.insert("loop-self", self_digest);

    let mut child = (good.clone(), OCI_MANIFEST.to_string(), good_body.len());
    manifests.insert(
        ("deep".to_string(), good.clone()),
        entry(good_body.clone(), OCI_MANIFEST, true),
    );
    for _ in 0..DEEP_LEVELS {
        let body = json!({
            "schemaVersion": 2, "mediaType": OCI_INDEX,
            "manifests": [{"mediaType": child.1, "digest": child.0, "size": child.2,
                           "platform": {"os": "linux", "architecture": "amd64"}}],
        })
        .to_string()
        .into_bytes();
        let d = sha256_digest(&body);
        let len = body.len();
        manifests.insert(
            ("deep".to_string(), d.clone()),
            entry(body.clone(), OCI_INDEX, true),
        );
        manifests.insert(
            ("deep".to_string(), "latest".to_string()),
            entry(body, OCI_INDEX, true),
        );
        child = (d, OCI_INDEX.to_string(), len);
    }
    digests.insert("deep", child.0);

    let unknown = json!({"schemaVersion": 2, "mediaType": "application/vnd.example.unknown+json", "config": {}});
    put(
        &mut manifests,
        "unknowntype",
        entry(unknown.to_string().into_bytes(), OCI_MANIFEST, true),
    );
    put(
        &mut manifests,
        "malformed",
        entry(b"{not json".to_vec(), OCI_MANIFEST, true),
    );

    FaultState {
        manifests,
        blobs,
        throttle_remaining: AtomicUsize::new(opts.throttle_count),
        log: Mutex::new(Vec::new()),
        digests,
    }
}

async fn handle(State(state): State<Arc<FaultState>>, method: Method, uri: Uri) -> Response {
    let path = uri.path().to_string();
    let res = route(&state, &method, &path);
    state.log.lock().unwrap_or_else(|p| p.into_inner()).push((
        method.to_string(),
        path,
        res.status().as_u16(),
    ));
    res
}

fn route(state: &FaultState, method: &Method, path: &str) -> Response {
    if path == "/v2/" || path == "/v2" {
        return respond(StatusCode::OK, &[], b"{}".to_vec(), method);
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return not_found(method);
    };
    if let Some((repo, reference)) = rest.split_once("/manifests/") {
        return manifest(state, method, repo, reference);
    }
    if let Some((_repo, digest)) = rest.split_once("/blobs/") {
        return match state.blobs.get(digest) {
            Some(b) => respond(
                StatusCode::OK,
                &[("Docker-Content-Digest", digest)],
                b.clone(),
                method,
            ),
            None => not_found(method),
        };
    }
    not_found(method)
}

fn manifest(state: &FaultState, method: &Method, repo: &str, reference: &str) -> Response {
    match repo {
        "unavailable" => {
            return respond(
                StatusCode::SERVICE_UNAVAILABLE,
                &[],
                b"unavailable".to_vec(),
                method,
            );
        }
        "throttled" => {
            let throttled = state
                .throttle_remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if throttled {
                let body =
                    br#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#.to_vec();
                return respond(
                    StatusCode::TOO_MANY_REQUESTS,
                    &[("Retry-After", "1")],
                    body,
                    method,
                );
            }
        }
        _ => {}
    }
    let Some(e) = state
        .manifests
        .get(&(repo.to_string(), reference.to_string()))
    else {
        return not_found(method);
    };
    let mut headers = vec![(header::CONTENT_TYPE.as_str(), e.media_type.as_str())];
    if let Some(d) = &e.digest_header {
        headers.push(("Docker-Content-Digest", d.as_str()));
    }
    respond(StatusCode::OK, &headers, e.body.clone(), method)
}

fn not_found(method: &Method) -> Response {
    let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#.to_vec();
    respond(StatusCode::NOT_FOUND, &[], body, method)
}

fn respond(
    status: StatusCode,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    method: &Method,
) -> Response {
    let mut b = Response::builder()
        .status(status)
        .header(header::CONTENT_LENGTH, body.len());
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::from(body)
    };
    b.body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// Accepts TCP connections on 127.0.0.1 and never answers (deadline tests).
pub struct HungRegistry {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl HungRegistry {
    /// Starts the listener.
    pub async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io("binding hung registry"))?;
        let addr = listener.local_addr().map_err(io("hung registry address"))?;
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        Ok(Self { addr, task })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for HungRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback `host:port` where nothing listens (connection refused). The port comes from
/// below the ephemeral range ([`crate::free_port`]), so no `:0` listener or outgoing connection
/// of the test run takes it meanwhile.
pub fn refused_host() -> Result<String> {
    Ok(format!("127.0.0.1:{}", crate::free_port()?))
}

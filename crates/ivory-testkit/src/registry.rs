//! `RegistryHarness`: the real `docker-registry` (CNCF Distribution) on a loopback port,
//! with TLS from a generated CA and no auth, htpasswd basic auth, or token auth.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Result, io};
use crate::pki::{TestPki, TokenSigner};
use crate::ports::{START_ATTEMPTS, free_port, is_port_taken};
use crate::token::{TOKEN_ISSUER, TOKEN_SERVICE, TokenServer, TokenState, TokenTls};

/// Binary started by the harness (Debian package `docker-registry`).
pub const REGISTRY_BINARY: &str = "docker-registry";
/// How long to wait for the registry to answer `/v2/`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one readiness probe waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Distribution writes its log line just after the response; give it this long.
const LOG_SETTLE: Duration = Duration::from_millis(150);

/// How clients authenticate to the harness registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AuthMode {
    /// No authentication.
    #[default]
    None,
    /// htpasswd (bcrypt) HTTP basic auth with one user.
    Basic {
        /// The one accepted user name.
        user: String,
        /// Its password.
        password: String,
    },
    /// Bearer tokens from an in-process token server. `login: None` grants tokens to
    /// anonymous clients (the Docker Hub public-image flow); `Some` requires that login.
    Token {
        /// The user name and password the token server requires, if any.
        login: Option<(String, String)>,
    },
}

/// How [`RegistryHarness`] starts its registry: authentication and TLS.
#[derive(Clone, Debug)]
pub struct HarnessOptions {
    /// Authentication mode.
    pub auth: AuthMode,
    /// Serve HTTPS with a generated CA (default) or plain HTTP. The token realm of
    /// [`AuthMode::Token`] is served the same way.
    pub tls: bool,
    /// Serve the token realm over plain HTTP even when the registry uses TLS (a hostile or
    /// misconfigured registry; clients must refuse it).
    pub plain_http_token_realm: bool,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        Self {
            auth: AuthMode::None,
            tls: true,
            plain_http_token_realm: false,
        }
    }
}

impl HarnessOptions {
    /// TLS + htpasswd basic auth for one user.
    pub fn basic(user: &str, password: &str) -> Self {
        Self {
            auth: AuthMode::Basic {
                user: user.to_string(),
                password: password.to_string(),
            },
            ..Self::default()
        }
    }

    /// TLS + bearer tokens; `login: None` serves anonymous clients too.
    pub fn token(login: Option<(&str, &str)>) -> Self {
        Self {
            auth: AuthMode::Token {
                login: login.map(|(u, p)| (u.to_string(), p.to_string())),
            },
            ..Self::default()
        }
    }

    /// Plain HTTP, no auth.
    pub fn plain_http() -> Self {
        Self {
            auth: AuthMode::None,
            tls: false,
            plain_http_token_realm: false,
        }
    }
}

/// One logged registry request.
pub type LoggedRequest = (String, String, u16);

/// Starts harness registries.
pub struct RegistryHarness;

impl RegistryHarness {
    /// [`RegistryHarness::start`] with the default options: TLS, no auth.
    pub async fn start_default() -> Result<Harness> {
        Self::start(HarnessOptions::default()).await
    }

    /// Starts `docker-registry serve` in a temp dir on a free 127.0.0.1 port and waits
    /// until it answers; starts again on another port if it lost the race for one.
    pub async fn start(opts: HarnessOptions) -> Result<Harness> {
        let mut attempt = 1;
        loop {
            match Self::start_on(&opts, free_port()?).await {
                Err(err) if is_port_taken(&err) && attempt < START_ATTEMPTS => attempt += 1,
                done => return done,
            }
        }
    }

    async fn start_on(opts: &HarnessOptions, port: u16) -> Result<Harness> {
        let dir = tempfile::Builder::new()
            .prefix("ivory-registry-harness-")
            .tempdir()
            .map_err(io("creating harness temp dir"))?;
        let pki = TestPki::generate("ivory-testkit CA")?;
        let host = format!("127.0.0.1:{port}");

        let mut token_server = None;
        let auth_yaml = match &opts.auth {
            AuthMode::None => String::new(),
            AuthMode::Basic { user, password } => {
                let htpasswd = dir.path().join("htpasswd");
                write_htpasswd(&htpasswd, user, password)?;
                format!(
                    "auth:\n  htpasswd:\n    realm: ivory-basic\n    path: {}\n",
                    htpasswd.display()
                )
            }
            AuthMode::Token { login } => {
                let signer = TokenSigner::generate()?;
                let bundle = dir.path().join("token-root.pem");
                write(&bundle, signer.cert_pem.as_bytes())?;
                let tls = (opts.tls && !opts.plain_http_token_realm).then(|| TokenTls {
                    chain_pem: pki.server_chain_pem.clone(),
                    key_pem: pki.server_key_pem.clone(),
                });
                let server =
                    TokenServer::start(TokenState::new(signer, login.clone()), tls).await?;
                let yaml = format!(
                    "auth:\n  token:\n    realm: {}\n    service: {TOKEN_SERVICE}\n    issuer: {TOKEN_ISSUER}\n    rootcertbundle: {}\n",
                    server.realm(),
                    bundle.display()
                );
                token_server = Some(server);
                yaml
            }
        };
        let tls_yaml = if opts.tls {
            let cert = dir.path().join("server.pem");
            let key = dir.path().join("server.key");
            write(&cert, pki.server_chain_pem.as_bytes())?;
            write(&key, pki.server_key_pem.as_bytes())?;
            format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            )
        } else {
            String::new()
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  formatter: json\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\n\
             http:\n  addr: {host}\n  secret: ivory-testkit\n{tls_yaml}{auth_yaml}",
            data = dir.path().join("data").display(),
        );
        let config_path = dir.path().join("config.yml");
        write(&config_path, config.as_bytes())?;

        let log_path = dir.path().join("access.log");
        let stdout = std::fs::File::create(&log_path).map_err(io("creating access log"))?;
        let stderr = std::fs::File::create(dir.path().join("registry.log"))
            .map_err(io("creating registry log"))?;
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(io(format!("spawning {REGISTRY_BINARY}")))?;

        let mut harness = Harness {
            child: Some(child),
            host,
            tls: opts.tls,
            auth: opts.auth.clone(),
            ca_pem: pki.ca_pem,
            log_path,
            log_offset: Mutex::new(0),
            token_server,
            dir: Some(dir),
        };
        harness.wait_ready().await?;
        harness.reset_requests();
        Ok(harness)
    }
}

/// A running registry; dropping it kills the process and removes its directory.
pub struct Harness {
    child: Option<Child>,
    host: String,
    tls: bool,
    auth: AuthMode,
    ca_pem: String,
    log_path: PathBuf,
    log_offset: Mutex<u64>,
    token_server: Option<TokenServer>,
    dir: Option<tempfile::TempDir>,
}

impl Harness {
    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// PEM of the CA that signed the registry's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// `https://HOST` or `http://HOST`.
    pub fn base_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.host)
    }

    /// The auth mode the registry runs with.
    pub fn auth(&self) -> &AuthMode {
        &self.auth
    }

    /// Temp directory holding config, data and logs.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(|d| d.path())
    }

    /// Requests in the registry's access log since start or the last [`Harness::reset_requests`],
    /// as `(method, path?query, status)`.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        std::thread::sleep(LOG_SETTLE);
        let offset = *self.log_offset.lock().unwrap_or_else(|p| p.into_inner());
        let text = std::fs::read(&self.log_path).unwrap_or_default();
        let start = usize::try_from(offset).unwrap_or(0).min(text.len());
        parse_log(&String::from_utf8_lossy(&text[start..]))
    }

    /// Forgets logged requests: later [`Harness::requests`] calls only see newer ones.
    pub fn reset_requests(&self) {
        std::thread::sleep(LOG_SETTLE);
        let len = std::fs::metadata(&self.log_path)
            .map(|m| m.len())
            .unwrap_or(0);
        *self.log_offset.lock().unwrap_or_else(|p| p.into_inner()) = len;
    }

    /// Token requests seen by the token server (`"<status> scope=…"`), token mode only.
    pub fn token_requests(&self) -> Vec<String> {
        self.token_server
            .as_ref()
            .map(|t| {
                t.state
                    .log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            })
            .unwrap_or_default()
    }

    /// Clears the token server log.
    pub fn reset_token_requests(&self) {
        if let Some(t) = &self.token_server {
            t.state
                .log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
    }

    /// Registry stderr (JSON app log) so far, for failure messages.
    pub fn log_text(&self) -> String {
        self.dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.path().join("registry.log")).ok())
            .unwrap_or_default()
    }

    /// `Authorization` header value for pushing to `repo`, if the mode needs one.
    pub(crate) fn push_authorization(&self, repo: &str) -> Result<Option<String>> {
        use base64::Engine as _;
        match &self.auth {
            AuthMode::None => Ok(None),
            AuthMode::Basic { user, password } => Ok(Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            ))),
            AuthMode::Token { .. } => {
                let server = self
                    .token_server
                    .as_ref()
                    .ok_or_else(|| Error::Http("token mode without token server".into()))?;
                let token = server.state.mint(
                    "ivory-testkit-pusher",
                    &[format!("repository:{repo}:pull,push")],
                )?;
                Ok(Some(format!("Bearer {token}")))
            }
        }
    }

    /// reqwest client trusting the harness CA.
    pub fn http_client(&self) -> Result<reqwest::Client> {
        let cert = reqwest::Certificate::from_pem(self.ca_pem.as_bytes())
            .map_err(|e| Error::Http(format!("harness CA: {e}")))?;
        reqwest::Client::builder()
            .tls_certs_merge([cert])
            .build()
            .map_err(|e| Error::Http(format!("building client: {e}")))
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.http_client()?;
        let url = format!("{}/v2/", self.base_url());
        let started = ivory_clock::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(Error::Startup(format!(
                    "{REGISTRY_BINARY} exited with {status}: {}",
                    tail(&self.log_text())
                )));
            }
            // Bounded: a port held by something that accepts and never answers must not hang.
            let probe = client.get(&url).timeout(PROBE_TIMEOUT).send();
            if probe.await.is_ok() {
                // Another server on the port may have answered while ours failed to bind; ours
                // is the one answering only if it is still running a moment later.
                tokio::time::sleep(LOG_SETTLE).await;
                if let Some(child) = self.child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    return Err(Error::Startup(format!(
                        "{REGISTRY_BINARY} exited with {status}: {}",
                        tail(&self.log_text())
                    )));
                }
                return Ok(());
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                return Err(Error::Startup(format!(
                    "no answer on {url} after {STARTUP_TIMEOUT:?}: {}",
                    tail(&self.log_text())
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // TempDir removes the directory on drop.
        self.dir.take();
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(io(format!("writing {}", path.display())))
}

fn write_htpasswd(path: &Path, user: &str, password: &str) -> Result<()> {
    let out = Command::new("htpasswd")
        .args(["-Bbn", user, password])
        .output()
        .map_err(io("running htpasswd (apache2-utils)"))?;
    if !out.status.success() {
        return Err(Error::Startup(format!(
            "htpasswd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    write(path, &out.stdout)
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Parses Distribution's access log (Apache combined format, one line per request,
/// including 401 challenges and router 404s that the JSON app log omits).
fn parse_log(text: &str) -> Vec<LoggedRequest> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<LoggedRequest> {
    // 127.0.0.1 - - [date] "HEAD /v2/ HTTP/1.1" 200 2 "" "agent"
    let (_, rest) = line.split_once('"')?;
    let (request, rest) = rest.split_once('"')?;
    let mut parts = request.split(' ');
    let method = parts.next()?.to_string();
    let uri = parts.next()?.to_string();
    let status = rest.split_whitespace().next()?.parse().ok()?;
    Some((method, uri, status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_combined_access_log_lines() {
        let log = r#"127.0.0.1 - - [02/Dec/2026:11:05:29 +0000] "HEAD /v2/a/manifests/1 HTTP/1.1" 200 0 "" "ua"
garbage
127.0.0.1 - - [02/Dec/2026:11:05:29 +0000] "GET /v2/x HTTP/1.1" 404 91 "" "oci-client/0.18""#;
        assert_eq!(
            parse_log(log),
            vec![
                ("HEAD".into(), "/v2/a/manifests/1".into(), 200),
                ("GET".into(), "/v2/x".into(), 404)
            ]
        );
    }

    #[tokio::test]
    async fn a_taken_port_is_a_port_taken_startup_error() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = holder.local_addr().unwrap().port();
        let err = RegistryHarness::start_on(&HarnessOptions::plain_http(), port)
            .await
            .err()
            .expect("a second server cannot bind a held port");
        assert!(is_port_taken(&err), "{err}");
    }
}

//! Per-request credentials: docker config.json / `kubernetes.io/dockerconfigjson` secrets,
//! plus the policy's `allowInsecureRegistry`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use serde::Deserialize;

use crate::error::{Error, Result};

/// Host used by oci-client for Docker Hub references.
const DOCKER_HUB: &str = "index.docker.io";

/// Username/password for one registry host.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Basic {
    pub user: String,
    pub password: String,
}

impl fmt::Debug for Basic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Basic")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Credentials that apply to one admission request (one policy + pod pull secrets).
/// Cheap to clone; parse secrets once with [`Credentials::with_docker_config_json`].
/// Comparable and hashable so that caches of what a registry showed can be scoped to the
/// credential set (and `allow_insecure`) that saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Credentials {
    /// Policy allows plain HTTP and unverified TLS (Kyverno `allowInsecureRegistry`).
    pub allow_insecure: bool,
    auths: Arc<BTreeMap<String, Basic>>,
}

impl Credentials {
    /// No credentials, TLS required.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// Sets `allowInsecureRegistry`.
    pub fn allow_insecure(mut self, allow: bool) -> Self {
        self.allow_insecure = allow;
        self
    }

    /// Adds a username/password for `registry` (`host[:port]`).
    pub fn with_basic(mut self, registry: &str, user: &str, password: &str) -> Self {
        Arc::make_mut(&mut self.auths).insert(
            normalize_host(registry),
            Basic {
                user: user.to_string(),
                password: password.to_string(),
            },
        );
        self
    }

    /// Adds every entry of a docker `config.json` or the `.dockerconfigjson` value of a
    /// `kubernetes.io/dockerconfigjson` secret (legacy `.dockercfg` maps are accepted too).
    /// Entries already present win: secrets are added in pull-secret order.
    pub fn with_docker_config_json(mut self, source_name: &str, bytes: &[u8]) -> Result<Self> {
        let parsed = parse_docker_config(source_name, bytes)?;
        let auths = Arc::make_mut(&mut self.auths);
        for (host, basic) in parsed {
            auths.entry(host).or_insert(basic);
        }
        Ok(self)
    }

    /// A canonical byte encoding of everything that scopes a cache entry to this credential
    /// set: `allow_insecure` and every host, user and password, length-prefixed. It contains
    /// the secrets themselves: callers only feed it to a keyed hash, never store it.
    pub fn identity_bytes(&self) -> Vec<u8> {
        let mut out = vec![u8::from(self.allow_insecure)];
        for (host, basic) in self.auths.iter() {
            for field in [host, &basic.user, &basic.password] {
                out.extend_from_slice(&(field.len() as u64).to_be_bytes());
                out.extend_from_slice(field.as_bytes());
            }
        }
        out
    }

    /// True when nothing was configured for any host.
    pub fn is_empty(&self) -> bool {
        self.auths.is_empty()
    }

    pub(crate) fn basic_for(&self, registry: &str) -> Option<&Basic> {
        self.auths.get(&normalize_host(registry))
    }
}

/// The credentials one registry call carries, and the key its bearer tokens are kept under
/// (tokens are never shared across credential sets). ivory never sends a token it was given:
/// bearer tokens are always fetched from the registry's realm for the repository.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum RegistryAuth {
    /// No credentials.
    Anonymous,
    /// User name and password (or identity token as password), for Basic or a token realm.
    Basic(String, String),
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryAuth::Anonymous => f.write_str("Anonymous"),
            RegistryAuth::Basic(user, _) => write!(f, "Basic({user:?}, <redacted>)"),
        }
    }
}

/// Picks the auth for `registry`: request credentials first, then the global config.
pub(crate) fn registry_auth(
    registry: &str,
    creds: &Credentials,
    global: &Credentials,
) -> RegistryAuth {
    match creds
        .basic_for(registry)
        .or_else(|| global.basic_for(registry))
    {
        Some(b) => RegistryAuth::Basic(b.user.clone(), b.password.clone()),
        None => RegistryAuth::Anonymous,
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: Option<BTreeMap<String, AuthEntry>>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

fn parse_docker_config(source_name: &str, bytes: &[u8]) -> Result<Vec<(String, Basic)>> {
    let invalid = |detail: String| Error::InvalidCredentials {
        source_name: source_name.to_string(),
        detail,
    };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| invalid(format!("not JSON: {e}")))?;
    // `.dockerconfigjson` wraps entries in "auths"; legacy `.dockercfg` is the bare map.
    let entries: BTreeMap<String, AuthEntry> = if value.get("auths").is_some() {
        let cfg: DockerConfig =
            serde_json::from_value(value).map_err(|e| invalid(format!("bad auths: {e}")))?;
        cfg.auths.unwrap_or_default()
    } else {
        serde_json::from_value(value).map_err(|e| invalid(format!("bad auth map: {e}")))?
    };
    let mut out = Vec::with_capacity(entries.len());
    for (host, entry) in entries {
        if let Some(basic) = entry_basic(&entry).map_err(|e| invalid(format!("{host}: {e}")))? {
            out.push((normalize_host(&host), basic));
        }
    }
    Ok(out)
}

/// Why a dockerconfigjson entry's `auth` cannot be used; never quotes the secret.
#[derive(Debug, thiserror::Error)]
enum AuthFieldError {
    #[error("auth is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("auth is not UTF-8")]
    Utf8,
    #[error("auth is not user:password")]
    NoColon,
}

/// An entry without user/password (e.g. only `identitytoken`) yields no credentials.
fn entry_basic(entry: &AuthEntry) -> std::result::Result<Option<Basic>, AuthFieldError> {
    if let (Some(user), Some(password)) = (&entry.username, &entry.password)
        && !user.is_empty()
    {
        return Ok(Some(Basic {
            user: user.clone(),
            password: password.clone(),
        }));
    }
    let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(AuthFieldError::from)?;
    let text = String::from_utf8(decoded).map_err(|_| AuthFieldError::Utf8)?;
    let (user, password) = text.split_once(':').ok_or(AuthFieldError::NoColon)?;
    Ok(Some(Basic {
        user: user.to_string(),
        password: password.to_string(),
    }))
}

/// Reduces "https://index.docker.io/v1/", "docker.io" etc. to the host oci-client uses.
pub(crate) fn normalize_host(key: &str) -> String {
    let key = key.trim();
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "docker.io" | "registry-1.docker.io" | "index.docker.io" => DOCKER_HUB.to_string(),
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerconfigjson_auth_and_username_forms() {
        let json = br#"{"auths":{
            "https://index.docker.io/v1/":{"auth":"dXNlcjpwYXNz"},
            "reg.local:5000":{"username":"u2","password":"p:2"},
            "token.only":{"identitytoken":"x"}}}"#;
        let c = Credentials::anonymous()
            .with_docker_config_json("secret ns/pull", json)
            .unwrap();
        let hub = c.basic_for("docker.io").unwrap();
        assert_eq!((hub.user.as_str(), hub.password.as_str()), ("user", "pass"));
        let local = c.basic_for("REG.local:5000").unwrap();
        assert_eq!(local.password, "p:2");
        assert!(c.basic_for("token.only").is_none());
        assert!(c.basic_for("other").is_none());
    }

    #[test]
    fn legacy_dockercfg_map_is_accepted() {
        let json = br#"{"reg.local":{"auth":"YTpi"}}"#;
        let c = Credentials::anonymous()
            .with_docker_config_json("legacy", json)
            .unwrap();
        assert_eq!(c.basic_for("reg.local").unwrap().user, "a");
    }

    #[test]
    fn malformed_secrets_name_their_source() {
        let err = Credentials::anonymous()
            .with_docker_config_json("secret ns/bad", b"{not json")
            .unwrap_err();
        assert!(err.to_string().contains("secret ns/bad"), "{err}");
        let err = Credentials::anonymous()
            .with_docker_config_json("secret ns/bad64", br#"{"auths":{"h":{"auth":"!!"}}}"#)
            .unwrap_err();
        assert!(err.to_string().contains("h: auth is not base64"), "{err}");
        let err = Credentials::anonymous()
            .with_docker_config_json("s", br#"{"auths":{"h":{"auth":"bm9jb2xvbg=="}}}"#)
            .unwrap_err();
        assert!(err.to_string().contains("user:password"), "{err}");
    }

    #[test]
    fn first_secret_wins_and_request_creds_beat_global() {
        let a = br#"{"auths":{"h":{"username":"first","password":"1"}}}"#;
        let b = br#"{"auths":{"h":{"username":"second","password":"2"}}}"#;
        let c = Credentials::anonymous()
            .with_docker_config_json("a", a)
            .unwrap()
            .with_docker_config_json("b", b)
            .unwrap();
        let global = Credentials::anonymous().with_basic("h", "global", "g");
        assert_eq!(
            registry_auth("h", &c, &global),
            RegistryAuth::Basic("first".into(), "1".into())
        );
        assert_eq!(
            registry_auth("h", &Credentials::anonymous(), &global),
            RegistryAuth::Basic("global".into(), "g".into())
        );
        assert_eq!(registry_auth("x", &c, &global), RegistryAuth::Anonymous);
        let shown = format!("{:?}", registry_auth("h", &c, &global));
        assert!(shown.contains("first") && !shown.contains('1'), "{shown}");
    }
}

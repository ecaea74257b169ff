//! Kubernetes `url` library (Go `url.ParseRequestURI` semantics for the parts it exposes).

use std::collections::HashMap;
use std::sync::Arc;

use cel::Value;
use cel::objects::{Key, Map, Opaque};

use super::{FunctionError, Registry, opaque, string, wrap};

pub(super) const URL_TYPE: &str = "kubernetes.URL";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url {
    original: String,
    scheme: String,
    host: String,
    path: String,
    query: String,
}

impl Opaque for Url {
    fn runtime_type_name(&self) -> &str {
        URL_TYPE
    }
}

pub(super) fn to_string(o: &dyn Opaque) -> Option<String> {
    o.downcast_ref::<Url>().map(|u| u.original.clone())
}

/// An absolute URL (`scheme://…`, `scheme:opaque`) or an absolute path (`/…`).
pub(crate) fn parse(s: &str) -> Result<Url, FunctionError> {
    let err = |why: &str| {
        FunctionError::Invalid(format!(
            "URL parse error during conversion from string: parse {s:?}: {why}"
        ))
    };
    if s.is_empty() {
        return Err(err("empty url"));
    }
    if s.chars().any(|c| c.is_ascii_control() || c == ' ') {
        return Err(err("invalid character in URL"));
    }
    let (before_query, query) = s.split_once('?').unwrap_or((s, ""));
    if before_query.starts_with('/') {
        return Ok(Url {
            original: s.to_owned(),
            scheme: String::new(),
            host: String::new(),
            path: before_query.to_owned(),
            query: query.to_owned(),
        });
    }
    let Some((scheme, rest)) = before_query.split_once(':') else {
        return Err(err("invalid URI for request"));
    };
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if !scheme_ok {
        return Err(err("missing protocol scheme"));
    }
    // The url crate validates the authority (ports, IPv6 literals, …).
    url::Url::parse(s).map_err(|e| err(&e.to_string()))?;
    let (host, path) = match rest.strip_prefix("//") {
        Some(auth_path) => {
            let (auth, path) = match auth_path.find('/') {
                Some(i) => auth_path.split_at(i),
                None => (auth_path, ""),
            };
            // Drop userinfo: Go keeps it in URL.User, not in Host.
            let host = auth.rsplit_once('@').map_or(auth, |(_, h)| h);
            (host.to_owned(), path.to_owned())
        }
        None => (String::new(), String::new()),
    };
    Ok(Url {
        original: s.to_owned(),
        scheme: scheme.to_owned(),
        host,
        path,
        query: query.to_owned(),
    })
}

/// Go `URL.Hostname()`: host without port, IPv6 brackets removed.
fn hostname(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(h, _)| h);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// Go `URL.Port()`.
fn port(host: &str) -> &str {
    let after = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or("", |(_, p)| p),
        None => host.rfind(':').map_or("", |i| &host[i..]),
    };
    after
        .strip_prefix(':')
        .filter(|p| p.chars().all(|c| c.is_ascii_digit()))
        .unwrap_or("")
}

/// Go `URL.Query()`: `map<string, list<string>>`.
fn query_map(query: &str) -> Value {
    let mut map: HashMap<String, Vec<Value>> = HashMap::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        map.entry(k.into_owned())
            .or_default()
            .push(string(v.into_owned()));
    }
    let map = map
        .into_iter()
        .map(|(k, v)| (Key::String(Arc::new(k)), Value::List(Arc::new(v))))
        .collect();
    Value::Map(Map { map: Arc::new(map) })
}

fn url_member(a: &[Value], f: fn(&Url) -> Value) -> Option<Result<Value, FunctionError>> {
    match a {
        [v] => opaque::<Url>(v).map(|u| Ok(f(u))),
        _ => None,
    }
}

pub(super) fn register(r: &mut Registry) {
    r.add("url", |a| match a {
        [Value::String(s)] => Some(parse(s).map(wrap)),
        _ => None,
    });
    r.add("isURL", |a| match a {
        [Value::String(s)] => Some(Ok(Value::Bool(parse(s).is_ok()))),
        _ => None,
    });
    r.add("getScheme", |a| url_member(a, |u| string(u.scheme.clone())));
    r.add("getHost", |a| url_member(a, |u| string(u.host.clone())));
    r.add("getHostname", |a| {
        url_member(a, |u| string(hostname(&u.host)))
    });
    r.add("getPort", |a| url_member(a, |u| string(port(&u.host))));
    r.add("getEscapedPath", |a| {
        url_member(a, |u| string(u.path.clone()))
    });
    r.add("getQuery", |a| url_member(a, |u| query_map(&u.query)));
}

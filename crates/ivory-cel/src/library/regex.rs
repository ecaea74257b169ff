//! `matches` with a bounded cache of compiled regexes (cel's own recompiles per call), and
//! the Kubernetes regex library: `find`, `findAll`.

use std::sync::{Arc, LazyLock};

use cel::Value;
use regex::{Regex, RegexBuilder};

use super::{FunctionError, MATCHES_CACHED, Registry, string};

/// Distinct patterns kept compiled; policies use few, so this only bounds hostile input.
const CACHE_CAPACITY: u64 = 1024;
/// Compiled-program size limit per regex (bounds memory for adversarial patterns).
const REGEX_SIZE_LIMIT: usize = 1 << 21;

static CACHE: LazyLock<moka::sync::Cache<String, Arc<Regex>>> =
    LazyLock::new(|| moka::sync::Cache::new(CACHE_CAPACITY));

/// The compiled form of `pattern`, from the cache when possible.
pub(crate) fn compiled(pattern: &str) -> Result<Arc<Regex>, FunctionError> {
    if let Some(re) = CACHE.get(pattern) {
        return Ok(re);
    }
    let re = RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| FunctionError::Invalid(format!("'{pattern}' not a valid regex: {e}")))?;
    let re = Arc::new(re);
    CACHE.insert(pattern.to_owned(), Arc::clone(&re));
    Ok(re)
}

pub(super) fn register(r: &mut Registry) {
    r.add(MATCHES_CACHED, |a| match a {
        [Value::String(s), Value::String(p)] => {
            Some(compiled(p).map(|re| Value::Bool(re.is_match(s))))
        }
        _ => None,
    });
    r.add("find", |a| match a {
        [Value::String(s), Value::String(p)] => {
            Some(compiled(p).map(|re| string(re.find(s).map(|m| m.as_str()).unwrap_or_default())))
        }
        _ => None,
    });
    r.add("findAll", |a| match a {
        [Value::String(s), Value::String(p)] => Some(find_all(s, p, -1)),
        [Value::String(s), Value::String(p), Value::Int(n)] => Some(find_all(s, p, *n)),
        _ => None,
    });
}

/// Up to `limit` matches; a negative limit means all (Kubernetes `findAll(re, n)`).
fn find_all(s: &str, pattern: &str, limit: i64) -> Result<Value, FunctionError> {
    let re = compiled(pattern)?;
    let take = usize::try_from(limit).unwrap_or(usize::MAX);
    let found: Vec<Value> = re
        .find_iter(s)
        .take(take)
        .map(|m| string(m.as_str()))
        .collect();
    Ok(Value::List(Arc::new(found)))
}

//! Kyverno's JMESPath `conditions` (`any`/`all` blocks of `{key, operator, value}`) as CEL.
//!
//! Only forms whose Kyverno meaning (`pkg/engine/variables/operator`) a CEL expression can state
//! exactly are translated; anything else is refused with the condition named. Variables are
//! `{{ path }}` with a plain path (fields, quoted fields, `[n]`), read from `root` (the
//! attestation's predicate, or the request); an attestation's variables may also be the
//! JMESPath expressions `jmespath_cel` translates (filters, projections, `||`, `length()`…), and
//! `time_since('', '{{ path }}', '')` compared with a duration, over CEL's `time.now()`.

use serde_json::Value;

use super::error::{ConvertError, ErrorKind};
use super::images::{cel_string, has_wildcard, wildcard_to_regex};
use super::jmespath_cel;

/// Translates a JMESPath path (inside `{{ }}`) to CEL paths; an error when the path is not a
/// plain one (the caller knows which field held it).
pub(crate) type PathMapper<'a> = &'a dyn Fn(&str) -> Result<String, ErrorKind>;

/// `conditions` (a list of `{any, all}` blocks, all of which must hold) as one CEL boolean.
/// Errors name the field from the list down (`[0].all[1].key`).
pub(crate) fn translate_blocks(
    blocks: &[Value],
    map: PathMapper<'_>,
) -> Result<String, ConvertError> {
    let mut parts = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        parts.push(translate_block(block, map).map_err(|e| e.under(&format!("[{i}]")))?);
    }
    if parts.is_empty() {
        return Ok("true".to_owned());
    }
    Ok(parts.join(" && "))
}

/// One `{any: [...], all: [...]}` block (or, as Kyverno's older form, a list of conditions
/// that must all hold).
/// Errors name the field from the block down (`.all[1].key`).
pub(crate) fn translate_block(block: &Value, map: PathMapper<'_>) -> Result<String, ConvertError> {
    let Value::Object(obj) = block else {
        if let Value::Array(items) = block {
            return translate_list(items, " && ", map, "");
        }
        return Err(ConvertError::condition(
            "",
            "a condition block must be an object with any/all",
        ));
    };
    for key in obj.keys() {
        if key != "any" && key != "all" {
            return Err(ConvertError::condition(
                format!(".{key}"),
                "unknown field (only any and all)",
            ));
        }
    }
    let mut parts = Vec::new();
    if let Some(any) = obj.get("any") {
        let Value::Array(items) = any else {
            return Err(ConvertError::condition(".any", "must be a list"));
        };
        parts.push(translate_list(items, " || ", map, ".any")?);
    }
    if let Some(all) = obj.get("all") {
        let Value::Array(items) = all else {
            return Err(ConvertError::condition(".all", "must be a list"));
        };
        parts.push(translate_list(items, " && ", map, ".all")?);
    }
    Ok(match parts.len() {
        0 => "true".to_owned(),
        _ => parts.join(" && "),
    })
}

fn translate_list(
    items: &[Value],
    joiner: &str,
    map: PathMapper<'_>,
    at: &str,
) -> Result<String, ConvertError> {
    if items.is_empty() {
        // Kyverno: an empty `any` is false only when present and non-nil; an empty list
        // decodes as nil, so it holds.
        return Ok("true".to_owned());
    }
    let mut parts = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let cel = translate_condition(item, map).map_err(|e| e.under(&format!("{at}[{i}]")))?;
        parts.push(format!("({cel})"));
    }
    Ok(format!("({})", parts.join(joiner)))
}

/// One `{key, operator, value, message}`; errors name the field from the condition down
/// (`.key`).
pub(crate) fn translate_condition(
    cond: &Value,
    map: PathMapper<'_>,
) -> Result<String, ConvertError> {
    let Value::Object(obj) = cond else {
        return Err(ConvertError::condition("", "a condition must be an object"));
    };
    for key in obj.keys() {
        if !matches!(key.as_str(), "key" | "operator" | "value" | "message") {
            return Err(ConvertError::condition(format!(".{key}"), "unknown field"));
        }
    }
    let operator = obj
        .get("operator")
        .and_then(Value::as_str)
        .ok_or_else(|| ConvertError::condition(".operator", "Required value"))?;
    let key_value = obj.get("key").unwrap_or(&Value::Null);
    if let Some(call) = key_value.as_str().and_then(time_since_call) {
        let value = obj.get("value").unwrap_or(&Value::Null);
        let timestamp = call
            .and_then(|path| map(&path))
            .map_err(|kind| ConvertError::new(".key", kind))?;
        return time_since(&timestamp, operator, value).map_err(|cause| {
            let kind = ErrorKind::Operator {
                operator: operator.to_owned(),
                cause: Box::new(cause),
            };
            ConvertError::new("", kind)
        });
    }
    let key_cel = operand(key_value, map).map_err(|kind| ConvertError::new(".key", kind))?;
    let bound = is_computed(key_value).then_some("key");
    let key = bound.map_or_else(|| key_cel.clone(), str::to_owned);
    let value = obj.get("value").unwrap_or(&Value::Null);
    // The value is judged against its operator: the error names the condition and operator.
    let op = |cause: ErrorKind| {
        let kind = ErrorKind::Operator {
            operator: operator.to_owned(),
            cause: Box::new(cause),
        };
        ConvertError::new("", kind)
    };
    let cel = match operator {
        "Equals" | "Equal" => equals(&key, value).map_err(op),
        "NotEquals" | "NotEqual" => equals(&key, value).map(|c| format!("!({c})")).map_err(op),
        "In" | "AllIn" => membership(&key, value, Membership::Every).map_err(op),
        "AnyIn" => membership(&key, value, Membership::Some).map_err(op),
        "NotIn" | "AnyNotIn" => membership(&key, value, Membership::NotEvery).map_err(op),
        "AllNotIn" => membership(&key, value, Membership::None).map_err(op),
        "GreaterThan" => numeric(&key, value, ">").map_err(op),
        "GreaterThanOrEquals" => numeric(&key, value, ">=").map_err(op),
        "LessThan" => numeric(&key, value, "<").map_err(op),
        "LessThanOrEquals" => numeric(&key, value, "<=").map_err(op),
        other => Err(ConvertError::unsupported(
            ".operator",
            format!(
                "{other:?} is not converted (supported: Equals, NotEquals, In, AnyIn, AllIn, \
                 NotIn, AnyNotIn, AllNotIn, GreaterThan, GreaterThanOrEquals, LessThan, \
                 LessThanOrEquals)"
            ),
        )),
    }?;
    Ok(match bound {
        Some(name) => format!("cel.bind({name}, {key_cel}, {cel})"),
        None => cel,
    })
}

/// The CEL of a key or value: a `{{ path }}` variable, a `regex_match` call or a literal.
fn operand(v: &Value, map: PathMapper<'_>) -> Result<String, ErrorKind> {
    if let Value::String(s) = v
        && let Some((pattern, path)) = regex_match_call(s)
    {
        return regex_match(&pattern, &path, map);
    }
    match v {
        Value::String(s) => match variable(s)? {
            Some(path) => map(&path),
            None => Ok(cel_string(s)),
        },
        other => literal(other),
    }
}

/// Whether the key `v` is a JMESPath expression other than a plain path: its CEL is bound to
/// a name once, so the operator's several reads of it do not compute it again.
fn is_computed(v: &Value) -> bool {
    matches!(v, Value::String(s)
        if regex_match_call(s).is_none()
            && matches!(variable(s), Ok(Some(path)) if split_path(&path).is_err()))
}

/// `Some(path)` for a string that is exactly one `{{ path }}`; `None` for a plain string; an
/// error for text mixing variables and literal text.
fn variable(s: &str) -> Result<Option<String>, ErrorKind> {
    let trimmed = s.trim();
    if !s.contains("{{") {
        return Ok(None);
    }
    let inner = trimmed
        .strip_prefix("{{")
        .and_then(|r| r.strip_suffix("}}"))
        .filter(|inner| balanced(inner))
        .ok_or_else(|| {
            ErrorKind::VariableNotAllowed(format!(
                "{s:?}: text around or between {{{{ }}}} variables is not converted"
            ))
        })?;
    let inner = inner.trim();
    // Kyverno's `{{- ... }}` (shallow substitution) reads the same value.
    let inner = inner.strip_prefix('-').unwrap_or(inner).trim();
    Ok(Some(inner.to_owned()))
}

/// Whether every `{{` in `inner` is closed by a later `}}` (a variable nested in the
/// expression, as Kyverno substitutes it first), so that `inner` is one variable's text.
fn balanced(inner: &str) -> bool {
    let mut depth = 0usize;
    let mut rest = inner;
    while let Some(at) = rest.find(['{', '}']) {
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("{{") {
            depth += 1;
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            let Some(less) = depth.checked_sub(1) else {
                return false;
            };
            depth = less;
            rest = after;
        } else {
            rest = &tail[1..];
        }
    }
    depth == 0
}

/// `{{ regex_match('<pattern>', '{{ path }}') }}` (or with the path bare): the pattern and the
/// path, when `s` is exactly that call (the form Kyverno's policy library uses for builder ids).
fn regex_match_call(s: &str) -> Option<(String, String)> {
    let inner = s.trim().strip_prefix("{{")?.strip_suffix("}}")?.trim();
    let args = inner
        .strip_prefix("regex_match(")?
        .strip_suffix(')')?
        .trim();
    let (pattern, rest) = raw_string(args)?;
    let rest = rest.trim_start().strip_prefix(',')?.trim();
    let path = match raw_string(rest) {
        // The value substituted into a raw string: `'{{ path }}'`.
        Some((quoted, tail)) if tail.trim().is_empty() => {
            let path = quoted.trim().strip_prefix("{{")?.strip_suffix("}}")?;
            path.trim().to_owned()
        }
        Some(_) => return None,
        None => rest.to_owned(),
    };
    (!path.contains("{{") && !path.contains("}}")).then_some((pattern, path))
}

/// `{{ time_since('', '{{ path }}', '') }}` (or with the path bare): `Some` when `s` is a
/// `time_since` call, with the timestamp's path, or why its form is not converted.
fn time_since_call(s: &str) -> Option<Result<String, ErrorKind>> {
    let inner = s.trim().strip_prefix("{{")?.strip_suffix("}}")?.trim();
    let args = inner.strip_prefix("time_since(")?.strip_suffix(')')?.trim();
    let refused = || {
        Some(Err(ErrorKind::Unsupported(format!(
            "{s:?}: only time_since('', '{{{{ path }}}}', '') is converted (RFC 3339, since now)"
        ))))
    };
    let Some((layout, rest)) = raw_string(args) else {
        return refused();
    };
    let Some(rest) = rest.trim_start().strip_prefix(',') else {
        return refused();
    };
    let (path, rest) = match raw_string(rest.trim_start()) {
        Some((quoted, tail)) => match quoted
            .trim()
            .strip_prefix("{{")
            .and_then(|q| q.strip_suffix("}}"))
        {
            Some(path) => (path.trim().to_owned(), tail),
            None => return refused(),
        },
        None => match rest.split_once(',') {
            Some((path, tail)) => (path.trim().to_owned(), tail),
            None => return refused(),
        },
    };
    let rest = rest.trim_start();
    let rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    match raw_string(rest) {
        Some((until, tail)) if layout.is_empty() && until.is_empty() && tail.trim().is_empty() => {
            Some(Ok(path))
        }
        _ => refused(),
    }
}

/// Go's `time.Parse(time.RFC3339, …)` forms whose instant CEL's `timestamp()` reads alike:
/// upper-case `T` and `Z` (Go refuses the lower-case ones CEL takes), fields in range, at most
/// nanoseconds. Go also takes more fraction digits, a comma before them and the year 0: those
/// fail here, as every other text fails both.
const GO_RFC3339: &str = r"^(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$";

/// Largest value converted: Kyverno compares `Duration.Seconds()` float64s, which keep every
/// nanosecond apart below 2^22 seconds; 2^21 leaves a margin.
const TIME_SINCE_MAX_SECONDS: u64 = 1 << 21;

/// Kyverno's `time_since` (`t2.Sub(t1).String()`, `t2` now) compared with a duration by the
/// numeric operators (`pkg/engine/variables/operator`: both sides parse as durations and
/// compare as seconds) as CEL over `time.now()`: `now - t <= V` is `t >= now - V`, which no
/// timestamp range overflows. A timestamp Go would not parse is an error, as Kyverno's.
fn time_since(timestamp: &str, operator: &str, value: &Value) -> Result<String, ErrorKind> {
    let op = match operator {
        "LessThanOrEquals" => ">=",
        "LessThan" => ">",
        "GreaterThanOrEquals" => "<=",
        "GreaterThan" => "<",
        _ => {
            return Err(ErrorKind::Unsupported(
                "time_since is converted with GreaterThan, GreaterThanOrEquals, LessThan and \
                 LessThanOrEquals only"
                    .to_owned(),
            ));
        }
    };
    let seconds = value
        .as_str()
        .and_then(whole_duration_seconds)
        .filter(|s| *s > 0 && *s <= TIME_SINCE_MAX_SECONDS)
        .ok_or_else(|| {
            ErrorKind::Unsupported(format!(
                "value {value}: only a duration of whole hours, minutes and seconds (`168h`, \
                 `1h30m`), up to {TIME_SINCE_MAX_SECONDS}s, is converted"
            ))
        })?;
    Ok(format!(
        "cel.bind(ts, {timestamp}, type(ts) == string && ts.matches({}) ? \
         timestamp(ts) {op} time.now() - duration('{seconds}s') : \
         timestamp('time_since: not an RFC 3339 timestamp'))",
        cel_string(GO_RFC3339)
    ))
}

/// `168h`, `1h30m`, `90s`: a Go duration of whole hours, minutes and seconds, in seconds.
fn whole_duration_seconds(text: &str) -> Option<u64> {
    static WHOLE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^(?:([0-9]{1,7})h)?(?:([0-9]{1,9})m)?(?:([0-9]{1,11})s)?$")
            .unwrap_or_else(|_| unreachable!("constant regex"))
    });
    let caps = WHOLE.captures(text)?;
    let part = |i: usize, unit: u64| {
        caps.get(i)
            .map_or(Some(0), |m| m.as_str().parse::<u64>().ok())
            .map(|n| n * unit)
    };
    Some(part(1, 3600)? + part(2, 60)? + part(3, 1)?)
}

/// A JMESPath raw string literal (`'…'`, `\'` for a quote) at the start of `s`, and the rest.
fn raw_string(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('\'')?;
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if body[i + 1..].starts_with('\'') => {
                out.push('\'');
                chars.next();
            }
            '\'' => return Some((out, &body[i + 1..])),
            other => out.push(other),
        }
    }
    None
}

/// `regex_match(pattern, path)` as CEL. Kyverno's function is Go's `regexp.MatchString` over
/// the value substituted as text; CEL's `matches` is the same RE2 search (unanchored). A
/// pattern Rust's RE2-compatible engine refuses is refused here rather than failing every
/// admission.
fn regex_match(pattern: &str, path: &str, map: PathMapper<'_>) -> Result<String, ErrorKind> {
    regex::Regex::new(pattern).map_err(|e| {
        ErrorKind::Unsupported(format!(
            "regex_match pattern {pattern:?} is not a valid RE2 regexp: {e}"
        ))
    })?;
    Ok(format!(
        "string({}).matches({})",
        map(path)?,
        cel_string(pattern)
    ))
}

fn literal(v: &Value) -> Result<String, ErrorKind> {
    match v {
        Value::Null => Err(ErrorKind::Unsupported("null is not converted".to_owned())),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => {
            if n.is_f64() {
                let f = n.as_f64().unwrap_or_default();
                Ok(if f.fract() == 0.0 {
                    format!("{f:.1}")
                } else {
                    f.to_string()
                })
            } else {
                Ok(n.to_string())
            }
        }
        Value::String(s) => Ok(cel_string(s)),
        Value::Array(items) => {
            let inner = items.iter().map(literal).collect::<Result<Vec<_>, _>>()?;
            Ok(format!("[{}]", inner.join(", ")))
        }
        Value::Object(_) => Err(object_value()),
    }
}

/// Keys and values alike: an object has no CEL literal here.
fn object_value() -> ErrorKind {
    ErrorKind::Unsupported("an object value is not converted".to_owned())
}

/// Go's `time.ParseDuration` grammar and Kubernetes' quantity grammar: Kyverno's Equals compares
/// such strings as durations or quantities (`1h` equals `60m`), which string equality does not.
fn duration_or_quantity(s: &str) -> bool {
    static DURATION: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^[+-]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$")
            .unwrap_or_else(|_| unreachable!("constant regex"))
    });
    static QUANTITY: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$",
        )
        .unwrap_or_else(|_| unreachable!("constant regex"))
    });
    s == "0" || DURATION.is_match(s) || QUANTITY.is_match(s)
}

/// Kubernetes' quantity grammar in RE2, for the guard Kyverno's Equals has on wildcard values:
/// a key that parses as a quantity is compared as one, and a wildcard never is.
const QUANTITY_RE2: &str =
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$";

fn equals(key: &str, value: &Value) -> Result<String, ErrorKind> {
    match value {
        Value::String(s) => {
            if let Some(path) = variable(s)? {
                return Err(ErrorKind::VariableNotAllowed(format!(
                    "value {{{{ {path} }}}}: a variable as the value is not converted (Kyverno \
                     treats the value as a wildcard pattern)"
                )));
            }
            if duration_or_quantity(s) {
                return Err(ErrorKind::Unsupported(format!(
                    "value {s:?}: Kyverno compares it as a duration or quantity, not as text"
                )));
            }
            if has_wildcard(s) {
                // The guard matters only for a pattern that can match a quantity (one starting
                // with a digit, sign, dot or wildcard); it costs a regex match otherwise.
                let may_match_quantity = s.chars().next().is_some_and(|c| {
                    c.is_ascii_digit() || matches!(c, '+' | '-' | '.' | '*' | '?')
                });
                let guard = if may_match_quantity {
                    format!(" && !{key}.matches({})", cel_string(QUANTITY_RE2))
                } else {
                    String::new()
                };
                Ok(format!(
                    "type({key}) == string{guard} && {key}.matches({})",
                    cel_string(&wildcard_to_regex(s))
                ))
            } else {
                Ok(format!("{key} == {}", cel_string(s)))
            }
        }
        Value::Null => Err(ErrorKind::Unsupported(
            "a null value is not converted".to_owned(),
        )),
        Value::Object(_) => Err(object_value()),
        other => Ok(format!("{key} == {}", literal(other)?)),
    }
}

#[derive(Clone, Copy)]
enum Membership {
    /// `AllIn`, `In`: every element of a list key is in the values.
    Every,
    /// `AnyIn`: some element is.
    Some,
    /// `AnyNotIn`, `NotIn`: some element is not.
    NotEvery,
    /// `AllNotIn`: no element is.
    None,
}

fn membership(key: &str, value: &Value, kind: Membership) -> Result<String, ErrorKind> {
    let not_a_list = || ErrorKind::MalformedCondition("the value must be a list of strings".into());
    let Value::Array(items) = value else {
        return Err(not_a_list());
    };
    let mut strings = Vec::with_capacity(items.len());
    for item in items {
        let Value::String(s) = item else {
            return Err(not_a_list());
        };
        if has_wildcard(s) || s.contains("{{") {
            return Err(ErrorKind::Unsupported(format!(
                "value {s:?}: wildcards and variables in the list are not converted"
            )));
        }
        strings.push(cel_string(s));
    }
    let list = format!("[{}]", strings.join(", "));
    let (one, many) = match kind {
        // `sets.*` instead of comprehensions: the expression already runs inside one over the
        // images, and nested comprehensions exceed the cost limit.
        Membership::Every => (
            format!("{key} in {list}"),
            format!("sets.contains({list}, {key})"),
        ),
        Membership::Some => (
            format!("{key} in {list}"),
            format!("sets.intersects({key}, {list})"),
        ),
        Membership::NotEvery => (
            format!("!({key} in {list})"),
            format!("!sets.contains({list}, {key})"),
        ),
        Membership::None => (
            format!("!({key} in {list})"),
            format!("!sets.intersects({key}, {list})"),
        ),
    };
    Ok(format!(
        "type({key}) == string ? {one} : (type({key}) == list ? {many} : false)"
    ))
}

fn numeric(key: &str, value: &Value, op: &str) -> Result<String, ErrorKind> {
    let Value::Number(_) = value else {
        return Err(ErrorKind::Unsupported(
            "only a number value is converted (Kyverno also compares durations, quantities and \
             versions)"
                .to_owned(),
        ));
    };
    Ok(format!(
        "(type({key}) == int || type({key}) == uint || type({key}) == double) && {key} {op} {}",
        literal(value)?
    ))
}

/// The top-level names Kyverno's JSON context holds beside an attestation's predicate (it
/// merges the predicate into the context of the admission): a condition path starting with one
/// reads the admission, not the statement.
const ADMISSION_CONTEXT: [&str; 6] = [
    "request",
    "images",
    "element",
    "elementIndex",
    "serviceAccountName",
    "serviceAccountNamespace",
];

/// A condition path of an attestation as CEL over `predicate`; a path that Kyverno would read
/// from the admission context (the request, images, a rule `context` entry named by
/// `is_context_entry`) is refused rather than read from the predicate.
pub(crate) fn attestation_path(
    path: &str,
    is_context_entry: &dyn Fn(&str) -> bool,
) -> Result<String, ErrorKind> {
    let root_field = |first: &str| {
        if ADMISSION_CONTEXT.contains(&first) || is_context_entry(first) {
            return Err(ErrorKind::Unsupported(format!(
                "{{{{ {path} }}}}: reads {first:?} from Kyverno's admission context, not from \
                 the attestation's predicate; not converted"
            )));
        }
        Ok(())
    };
    let Ok(segments) = split_path(path) else {
        if path.contains("{{") {
            return Err(ErrorKind::VariableNotAllowed(format!(
                "{{{{ {path} }}}}: a variable nested in an expression is not converted"
            )));
        }
        let ctx = jmespath_cel::Context {
            root: "predicate",
            root_field: &root_field,
        };
        return jmespath_cel::to_cel(path, &ctx);
    };
    if let Some(Segment::Field(first)) = segments.first() {
        root_field(first)?;
    }
    path_to_cel("predicate", path)
}

/// A plain JMESPath path as CEL, read from `root`: `a.b."c-d"[0]` → `root.a.b['c-d'][0]`.
pub(crate) fn path_to_cel(root: &str, path: &str) -> Result<String, ErrorKind> {
    let mut out = root.to_owned();
    let segments = split_path(path)?;
    for segment in segments {
        match segment {
            Segment::Field(name) => {
                if super::images::is_cel_identifier(&name) {
                    out.push('.');
                    out.push_str(&name);
                } else {
                    out.push('[');
                    out.push_str(&cel_string(&name));
                    out.push(']');
                }
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    Ok(out)
}

/// The path's segments, for callers that map a prefix (`request.object` → `object`).
pub(crate) fn split_path(path: &str) -> Result<Vec<Segment>, ErrorKind> {
    let mut segments = Vec::new();
    let chars: Vec<char> = path.trim().chars().collect();
    let mut i = 0;
    let bad = || {
        ErrorKind::Unsupported(format!(
            "{{{{ {path} }}}}: only plain paths (fields, \"quoted\" fields, [n]) are converted, not JMESPath functions, filters or projections"
        ))
    };
    let mut expect_field = true;
    while i < chars.len() {
        let c = chars[i];
        if expect_field {
            if c == '"' {
                let mut name = String::new();
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        return Err(bad());
                    }
                    name.push(chars[i]);
                    i += 1;
                }
                if i >= chars.len() {
                    return Err(bad());
                }
                i += 1;
                segments.push(Segment::Field(name));
            } else if c.is_ascii_alphabetic() || c == '_' {
                let mut name = String::new();
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    name.push(chars[i]);
                    i += 1;
                }
                segments.push(Segment::Field(name));
            } else {
                return Err(bad());
            }
            expect_field = false;
        } else if c == '.' {
            expect_field = true;
            i += 1;
        } else if c == '[' {
            let mut digits = String::new();
            i += 1;
            while i < chars.len() && chars[i].is_ascii_digit() {
                digits.push(chars[i]);
                i += 1;
            }
            if digits.is_empty() || i >= chars.len() || chars[i] != ']' {
                return Err(bad());
            }
            i += 1;
            segments.push(Segment::Index(digits.parse().map_err(|_| bad())?));
        } else {
            return Err(bad());
        }
    }
    if segments.is_empty() || expect_field {
        return Err(bad());
    }
    Ok(segments)
}

/// One segment of a plain path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    /// `.name` or `."name"`.
    Field(String),
    /// `[n]`.
    Index(u64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_cel::{Activation, NoHost, Scope};
    use serde_json::json;

    fn predicate_path(path: &str) -> Result<String, ErrorKind> {
        path_to_cel("predicate", path)
    }

    fn attestation(path: &str) -> Result<String, ErrorKind> {
        attestation_path(path, &|_| false)
    }

    /// The conditions' CEL on `predicate`: its verdict, or the text of its error.
    fn verdict(conditions: &Value, predicate: &Value) -> Result<bool, String> {
        let blocks = conditions.as_array().cloned().unwrap_or_default();
        let cel = translate_blocks(&blocks, &attestation).unwrap();
        let program = ivory_cel::compile(&cel, &Scope::new(["predicate"]))
            .unwrap_or_else(|e| panic!("{cel}: {e}"));
        let mut act = Activation::new(&NoHost);
        act.bind_json("predicate", predicate);
        program.evaluate_bool(&act).map_err(|e| e.to_string())
    }

    /// A host whose wall clock reads 2025-01-08T00:00:00Z.
    struct FixedClock;

    impl ivory_cel::Host for FixedClock {
        fn verify_image_signatures(
            &self,
            _: &str,
            _: &[Value],
        ) -> Result<i64, ivory_cel::HostError> {
            Err(ivory_cel::HostError::NotAvailable)
        }
        fn verify_attestation_signatures(
            &self,
            _: &str,
            _: &str,
            _: &[Value],
        ) -> Result<i64, ivory_cel::HostError> {
            Err(ivory_cel::HostError::NotAvailable)
        }
        fn extract_payload(&self, _: &str, _: &str) -> Result<Value, ivory_cel::HostError> {
            Err(ivory_cel::HostError::NotAvailable)
        }
        fn image_data(&self, _: &str) -> Result<Value, ivory_cel::HostError> {
            Err(ivory_cel::HostError::NotAvailable)
        }
        fn wall_time(&self) -> std::time::SystemTime {
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_736_294_400)
        }
    }

    #[test]
    fn the_librarys_scan_age_condition_compares_time_since_with_the_clock() {
        // other/require-vulnerability-scan: the scan at most 168h before now (2025-01-08).
        let check = |operator: &str, value: &str, finished: Value| {
            let cond = json!([{"all": [{"key": "{{ time_since('','{{metadata.scanFinishedOn}}','') }}",
                                        "operator": operator, "value": value}]}]);
            let blocks = cond.as_array().cloned().unwrap_or_default();
            let cel = translate_blocks(&blocks, &attestation).unwrap();
            let program = ivory_cel::compile(&cel, &Scope::new(["predicate"]))
                .unwrap_or_else(|e| panic!("{cel}: {e}"));
            let mut act = Activation::new(&FixedClock);
            act.bind_json(
                "predicate",
                &json!({"metadata": {"scanFinishedOn": finished}}),
            );
            program.evaluate_bool(&act).map_err(|e| e.to_string())
        };
        let le = |finished: &str| check("LessThanOrEquals", "168h", json!(finished));
        assert_eq!(le("2025-01-01T00:00:00Z"), Ok(true)); // exactly 168h
        assert_eq!(le("2024-12-31T23:59:59.999999999Z"), Ok(false));
        assert_eq!(le("2025-01-01T01:00:00+01:00"), Ok(true));
        assert_eq!(le("2025-02-01T00:00:00Z"), Ok(true)); // in the future: negative
        assert_eq!(le("2024-01-01T00:00:00Z"), Ok(false));
        assert_eq!(
            check("LessThan", "168h", json!("2025-01-01T00:00:00Z")),
            Ok(false)
        );
        assert_eq!(
            check("GreaterThan", "1h30m", json!("2025-01-07T22:29:59Z")),
            Ok(true)
        );
        assert_eq!(
            check("GreaterThanOrEquals", "90m", json!("2025-01-07T22:31:00Z")),
            Ok(false)
        );
        // Go's time.Parse(RFC3339) refuses these (CEL's timestamp() takes the first two), and
        // Kyverno's substitution fails: an error here too.
        for bad in [
            "2025-01-01t00:00:00z",
            "2025-01-01 00:00:00Z",
            "2025-01-01",
            "yesterday",
        ] {
            assert!(le(bad).is_err(), "{bad}");
        }
        assert!(check("LessThanOrEquals", "168h", json!(1_736_294_400)).is_err());
        let refused = |cond: Value| {
            translate_blocks(&[json!({"all": [cond]})], &attestation)
                .unwrap_err()
                .to_string()
        };
        let key = "{{ time_since('','{{ t }}','') }}";
        let e = refused(json!({"key": key, "operator": "Equals", "value": "1h"}));
        assert!(e.contains("GreaterThan, GreaterThanOrEquals"), "{e}");
        let e = refused(json!({"key": key, "operator": "LessThan", "value": "1.5h"}));
        assert!(e.contains("whole hours"), "{e}");
        let e = refused(json!({"key": "{{ time_since('2006-01-02','{{ t }}','') }}",
                               "operator": "LessThan", "value": "1h"}));
        assert!(e.contains("only time_since('',"), "{e}");
    }

    #[test]
    fn the_librarys_cve_condition_checks_the_filtered_versions_or_none() {
        // other/verify-image-cve-2022-42889, as the library writes it.
        let cond = json!([{"all": [{"key": "{{ components[?name=='commons-text'].version || 'none' }}",
                                    "operator": "AllNotIn",
                                    "value": ["1.5", "1.6", "1.7", "1.8", "1.9"]}]}]);
        let sbom = |components: Value| json!({"components": components});
        let text = |v: &str| json!({"name": "commons-text", "version": v});
        assert_eq!(verdict(&cond, &sbom(json!([text("1.10.0")]))), Ok(true));
        assert_eq!(
            verdict(&cond, &sbom(json!([text("1.10.0"), text("1.9")]))),
            Ok(false)
        );
        assert_eq!(
            verdict(&cond, &sbom(json!([{"name": "x", "version": "1.9"}]))),
            Ok(true)
        );
        // No component of that name, or no components at all: the key is 'none'.
        assert_eq!(verdict(&cond, &sbom(json!([]))), Ok(true));
        assert_eq!(verdict(&cond, &json!({})), Ok(true));
        assert_eq!(verdict(&cond, &sbom(json!("commons-text"))), Ok(true));
    }

    #[test]
    fn the_librarys_tekton_scan_condition_counts_nothing_against_a_string() {
        // tekton/verify-tekton-taskrun-vuln-scan's first condition: the fork compares the
        // number with the string '8.0' as null, so no score is ever counted.
        let cond = json!([{"any": [{"key": "{{ matches[].vulnerability[].cvss[?metrics.impactScore > '8.0'][] | length(@) }}",
                                    "operator": "Equals", "value": 0}]}]);
        let scan =
            json!({"matches": [{"vulnerability": {"cvss": [{"metrics": {"impactScore": 9.9}}]}}]});
        assert_eq!(verdict(&cond, &scan), Ok(true));
        let counted = json!([{"any": [{"key": "{{ matches[].vulnerability[].cvss[?metrics.impactScore > `8`][] | length(@) }}",
                                       "operator": "Equals", "value": 0}]}]);
        assert_eq!(verdict(&counted, &scan), Ok(false));
        // No list of matches: length(null) fails Kyverno's substitution, and the CEL.
        assert!(verdict(&cond, &json!({})).is_err());
    }

    fn holds(conditions: Value, predicate: Value) -> bool {
        let blocks = conditions.as_array().cloned().unwrap_or_default();
        let cel = translate_blocks(&blocks, &predicate_path).unwrap();
        let program = ivory_cel::compile(&cel, &Scope::new(["predicate"]))
            .unwrap_or_else(|e| panic!("{cel}: {e}"));
        let mut act = Activation::new(&NoHost);
        act.bind_json("predicate", &predicate);
        program
            .evaluate_bool(&act)
            .unwrap_or_else(|e| panic!("{cel}: {e}"))
    }

    #[test]
    fn regex_match_over_one_variable_is_cels_matches() {
        let p = json!({"builder": {"id": "https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_container_slsa3.yml@refs/tags/v1.9.0"}, "n": 7});
        let pattern = "^https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_container_slsa3.yml@refs/tags/v[0-9].[0-9].[0-9]$";
        let cond = |key: String, value: Value| json!([{"all": [{"key": key, "operator": "Equals", "value": value}]}]);
        let library = format!("{{{{ regex_match('{pattern}','{{{{ builder.id}}}}') }}}}");
        assert!(holds(cond(library.clone(), json!(true)), p.clone()));
        assert!(!holds(cond(library, json!(false)), p.clone()));
        let bare = "{{ regex_match('^v[0-9]+$', builder.id) }}".to_owned();
        assert!(holds(cond(bare, json!(false)), p.clone()));
        let number = "{{ regex_match('^7$', '{{n}}') }}".to_owned();
        assert!(holds(cond(number, json!(true)), p.clone()));
        let quoted = "{{ regex_match('it\\'s', '{{ builder.id }}') }}".to_owned();
        assert_eq!(
            regex_match_call(&quoted).map(|(p, _)| p).as_deref(),
            Some("it's")
        );
        let bad = translate_blocks(
            &[
                json!({"all": [{"key": "{{ regex_match('(', '{{ builder.id }}') }}",
                              "operator": "Equals", "value": true}]}),
            ],
            &|path| path_to_cel("predicate", path),
        )
        .unwrap_err();
        assert!(bad.to_string().contains("not a valid RE2 regexp"), "{bad}");
    }

    #[test]
    fn equals_and_wildcards_follow_kyverno() {
        let p = json!({"builder": {"id": "https://ivory.test/builder@v1"}, "n": 3, "ok": true,
                       "list": ["a", "b"], "q": "10"});
        let eq = |key: &str, value: Value| {
            holds(
                json!([{"all": [{"key": key, "operator": "Equals", "value": value}]}]),
                p.clone(),
            )
        };
        assert!(eq(
            "{{ builder.id }}",
            json!("https://ivory.test/builder@v1")
        ));
        assert!(eq("{{builder.id}}", json!("https://ivory.test/*")));
        assert!(!eq("{{ builder.id }}", json!("https://other/*")));
        assert!(eq("{{ n }}", json!(3)));
        assert!(eq("{{ n }}", json!(3.0)));
        assert!(!eq("{{ n }}", json!("x3")));
        assert!(eq("{{ ok }}", json!(true)));
        // A key that parses as a quantity is never a wildcard match in Kyverno.
        assert!(!eq("{{ q }}", json!("1*")));
        assert!(holds(
            json!([{"any": [
                {"key": "{{ builder.id }}", "operator": "NotEquals", "value": "x"},
                {"key": "{{ n }}", "operator": "Equals", "value": 4}]}]),
            p.clone()
        ));
    }

    #[test]
    fn membership_and_numbers() {
        let p = json!({"list": ["a", "b"], "s": "a", "n": 7});
        let check = |key: &str, op: &str, value: Value| {
            holds(
                json!([{"all": [{"key": key, "operator": op, "value": value}]}]),
                p.clone(),
            )
        };
        assert!(check("{{ s }}", "AnyIn", json!(["a", "z"])));
        assert!(check("{{ list }}", "AnyIn", json!(["b", "z"])));
        assert!(!check("{{ list }}", "AllIn", json!(["b", "z"])));
        assert!(check("{{ list }}", "AllIn", json!(["a", "b", "z"])));
        assert!(check("{{ list }}", "AnyNotIn", json!(["a"])));
        assert!(!check("{{ list }}", "AllNotIn", json!(["a"])));
        assert!(check("{{ s }}", "NotIn", json!(["x"])));
        assert!(check("{{ n }}", "GreaterThan", json!(5)));
        assert!(check("{{ n }}", "LessThanOrEquals", json!(7)));
        assert!(!check("{{ n }}", "LessThan", json!(7)));
    }

    #[test]
    fn unsupported_forms_are_refused_with_the_condition_named() {
        let refuse = |cond: Value| {
            let blocks = vec![json!({"all": [cond]})];
            translate_blocks(&blocks, &attestation)
                .unwrap_err()
                .to_string()
        };
        let e = refuse(json!({"key": "{{ to_upper(a) }}", "operator": "Equals", "value": "A"}));
        assert!(e.starts_with("[0].all[0].key: "), "{e}");
        assert!(
            e.contains("the function to_upper() is not converted"),
            "{e}"
        );
        let e = refuse(json!({"key": "{{ a.* }}", "operator": "Equals", "value": 2}));
        assert!(
            e.contains("the object wildcard '*' is not converted"),
            "{e}"
        );
        let e = refuse(json!({"key": "{{ a[1:] }}", "operator": "Equals", "value": 2}));
        assert!(e.contains("a slice is not converted"), "{e}");
        let e = refuse(json!({"key": "{{ a[?b=='c' }}", "operator": "Equals", "value": 2}));
        assert!(e.contains("not a JMESPath expression"), "{e}");
        let e = refuse(json!({"key": "{{ length(a)[?b] }}", "operator": "Equals", "value": 0}));
        assert!(
            e.contains("a function call on a projection's left side"),
            "{e}"
        );
        let e = refuse(
            json!({"key": "{{ request.operation || 'x' }}", "operator": "Equals", "value": "x"}),
        );
        assert!(e.contains("admission context"), "{e}");
        let e =
            refuse(json!({"key": "{{ to_upper('{{ t }}') }}", "operator": "Equals", "value": "A"}));
        assert!(e.contains("a variable nested in an expression"), "{e}");
        let e = refuse(json!({"key": "{{ a }}", "operator": "DurationGreaterThan", "value": "1h"}));
        assert!(e.contains("DurationGreaterThan"), "{e}");
        let e = refuse(json!({"key": "{{ a }}", "operator": "Equals", "value": "1h"}));
        assert!(e.contains("duration or quantity"), "{e}");
        let e = refuse(json!({"key": "x-{{ a }}", "operator": "Equals", "value": "y"}));
        assert!(e.contains("text around"), "{e}");
        let e = refuse(json!({"key": "{{ a }}", "operator": "AnyIn", "value": ["a*"]}));
        assert!(e.contains("wildcards"), "{e}");
    }

    #[test]
    fn paths_become_cel() {
        assert_eq!(
            path_to_cel("p", r#"a."b-c"[2].in"#).unwrap(),
            "p.a['b-c'][2]['in']"
        );
        assert!(split_path("a[*]").is_err());
        assert!(split_path("a | b").is_err());
        assert!(split_path("a.").is_err());
    }
}

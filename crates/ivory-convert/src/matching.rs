//! `match` / `exclude` / `preconditions` of a legacy rule as `matchConstraints` and
//! `matchConditions`.
//!
//! Kinds and operations become resource rules; namespaces, names, subjects and preconditions
//! become CEL conditions on `request` and `object` (evaluated by Kyverno and ivory alike, also
//! where ivory cannot see Namespace labels); `selector` and `namespaceSelector` map to the
//! selectors of the same name. Forms with no exact equivalent (roles, clusterRoles, several
//! filters mixing kinds with other constraints, selectors in exclusions) are refused.

use std::collections::BTreeSet;

use serde_json::Value;

use super::conditions::{self, Segment};
use super::error::{ConvertError, ErrorKind};
use super::images::{cel_string, cel_string_list, has_wildcard, wildcard_to_regex};
use super::model::{MatchResources, ResourceDescription, ResourceFilter, Subject};
use ivory_policy::types::{LabelSelector, MatchResources as Constraints, NamedRuleWithOperations};

/// What a rule's match, exclude and preconditions became.
#[derive(Debug, Default)]
pub(crate) struct Matched {
    pub constraints: Constraints,
    pub conditions: Vec<(String, String)>,
}

/// A kind Kyverno names → its group, version and resource. Only kinds whose images an
/// ImageValidatingPolicy extracts (docs/kyverno-semantics.md §8): not ReplicationController.
fn gvr(kind: &str) -> Option<(&'static str, &'static str, &'static str)> {
    // `v1/Pod`, `apps/v1/Deployment` and `Pod` all name the same kind.
    let bare = kind.rsplit('/').next().unwrap_or(kind);
    let (g, v, r) = match bare {
        "Pod" => ("", "v1", "pods"),
        "Deployment" => ("apps", "v1", "deployments"),
        "StatefulSet" => ("apps", "v1", "statefulsets"),
        "DaemonSet" => ("apps", "v1", "daemonsets"),
        "ReplicaSet" => ("apps", "v1", "replicasets"),
        "Job" => ("batch", "v1", "jobs"),
        "CronJob" => ("batch", "v1", "cronjobs"),
        _ => return None,
    };
    let prefix_ok = match kind.matches('/').count() {
        0 => true,
        1 => kind.starts_with(&format!("{v}/")),
        2 => kind.starts_with(&format!("{g}/{v}/")),
        _ => false,
    };
    prefix_ok.then_some((g, v, r))
}

/// A kind as Kyverno's `ParseKindSelector` reads it (`pkg/utils/kube/kind.go`): `Kind`,
/// `version/Kind`, `group/version/Kind`, each with an optional `/subresource` or
/// `.subresource`; `*` for what is not written.
#[derive(Debug, PartialEq, Eq)]
struct KindSelector<'a> {
    group: &'a str,
    version: &'a str,
    kind: &'a str,
    subresource: &'a str,
}

fn kind_selector(input: &str) -> Option<KindSelector<'_>> {
    let mut parts: Vec<&str> = input.split('/').collect();
    if let Some(last) = parts.pop() {
        parts.extend(last.split('.'));
    }
    let version = |p: &str| {
        p == "*" || {
            let rest = p.strip_prefix('v').unwrap_or("");
            let mut chars = rest.chars();
            chars.next().is_some_and(|c| c.is_ascii_digit()) && {
                let tail = chars.as_str();
                tail.is_empty()
                    || ["alpha", "beta"].iter().any(|stage| {
                        tail.strip_prefix(stage)
                            .is_some_and(|n| n.len() == 1 && n.chars().all(|c| c.is_ascii_digit()))
                    })
            }
        }
    };
    let s = |group, version, kind, subresource| {
        Some(KindSelector {
            group,
            version,
            kind,
            subresource,
        })
    };
    match parts.as_slice() {
        [kind] => s("*", "*", kind, ""),
        ["*", "*"] => s("*", "*", "*", "*"),
        ["*", sub] if sub.to_lowercase() == *sub => s("*", "*", "*", sub),
        [v, kind] if version(v) => s("*", v, kind, ""),
        [kind, sub] => s("*", "*", kind, sub),
        [v, kind, sub] if version(v) => s("*", v, kind, sub),
        [g, v, kind] => s(g, v, kind, ""),
        [g, v, kind, sub] => s(g, v, kind, sub),
        _ => None,
    }
}

/// A kind's resource as Kubernetes guesses it (`meta.UnsafeGuessKindToResource`): lower case,
/// `-es` after `s`, `-ies` for a final `y`, else `-s`. Kyverno reads it from discovery; a
/// custom resource whose plural is irregular must be renamed in the converted policy.
fn guessed_resource(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if lower.ends_with('s') {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

/// The resource rule of a kind read by a rule's own `imageExtractors` (a custom resource):
/// any group and version unless written, as Kyverno matches a bare kind in every group.
fn custom_resource_rule(selector: &str, ops: &[String]) -> Option<NamedRuleWithOperations> {
    let k = kind_selector(selector)?;
    let mut resource = guessed_resource(k.kind);
    if !k.subresource.is_empty() {
        resource = format!("{resource}/{}", k.subresource);
    }
    Some(NamedRuleWithOperations {
        api_groups: vec![k.group.to_owned()],
        api_versions: vec![k.version.to_owned()],
        resources: vec![resource],
        operations: ops.to_vec(),
        ..NamedRuleWithOperations::default()
    })
}

/// One filter reduced to kinds, operations, selectors and a CEL condition.
#[derive(Debug, Default)]
struct Filter {
    kinds: BTreeSet<String>,
    operations: BTreeSet<String>,
    selector: Option<LabelSelector>,
    namespace_selector: Option<LabelSelector>,
    condition: Option<String>,
}

fn filter(
    resources: Option<&ResourceDescription>,
    subjects: &[Subject],
    roles: &[String],
    cluster_roles: &[String],
    at: &str,
    custom: &BTreeSet<String>,
) -> Result<Filter, ConvertError> {
    if !roles.is_empty() || !cluster_roles.is_empty() {
        return Err(ConvertError::unsupported(
            at,
            "roles and clusterRoles are not converted (Kyverno resolves them from RBAC \
             bindings; a CEL condition cannot)",
        ));
    }
    let mut out = Filter::default();
    let mut parts = Vec::new();
    if let Some(r) = resources {
        for kind in &r.kinds {
            if kind_selector(kind).is_some_and(|k| custom.contains(k.kind)) {
                out.kinds.insert(kind.clone());
                continue;
            }
            if kind.contains('/')
                && kind
                    .split('/')
                    .next_back()
                    .is_some_and(|k| k.starts_with(char::is_lowercase))
            {
                return Err(ConvertError::unsupported(
                    format!("{at}.resources.kinds"),
                    format!("{kind:?}: subresources are not converted"),
                ));
            }
            if gvr(kind).is_none() {
                return Err(ConvertError::unsupported(
                    format!("{at}.resources.kinds"),
                    format!(
                        "{kind:?} is not converted (Pod, Deployment, StatefulSet, DaemonSet, \
                         ReplicaSet, Job, CronJob: the kinds whose images an \
                         ImageValidatingPolicy extracts)"
                    ),
                ));
            }
            out.kinds
                .insert(kind.rsplit('/').next().unwrap_or(kind).to_owned());
        }
        for op in &r.operations {
            if !matches!(op.as_str(), "CREATE" | "UPDATE" | "DELETE" | "CONNECT") {
                return Err(ConvertError::invalid(
                    format!("{at}.resources.operations"),
                    format!("unsupported value {op:?}"),
                ));
            }
            out.operations.insert(op.clone());
        }
        if !r.namespaces.is_empty() {
            parts.push(one_of("request.namespace", &r.namespaces));
        }
        let mut names = r.names.clone();
        if let Some(name) = r.name.clone().filter(|n| !n.is_empty()) {
            names.push(name);
        }
        if !names.is_empty() {
            parts.push(format!(
                "has(object.metadata.name) && ({})",
                one_of("object.metadata.name", &names)
            ));
        }
        if r.annotations.is_some() {
            return Err(ConvertError::unsupported(
                format!("{at}.resources.annotations"),
                "not converted",
            ));
        }
        out.selector.clone_from(&r.selector);
        out.namespace_selector = r.namespace_selector.clone();
    }
    if !subjects.is_empty() {
        let mut any = Vec::new();
        for (i, s) in subjects.iter().enumerate() {
            any.push(
                subject(s)
                    .map_err(|kind| ConvertError::new(format!("{at}.subjects[{i}]"), kind))?,
            );
        }
        parts.push(any.join(" || "));
    }
    out.condition = match parts.len() {
        0 => None,
        _ => Some(
            parts
                .iter()
                .map(|p| format!("({p})"))
                .collect::<Vec<_>>()
                .join(" && "),
        ),
    };
    Ok(out)
}

/// CEL: the request comes from subject `s`. The caller knows where `s` is.
fn subject(s: &Subject) -> Result<String, ErrorKind> {
    if has_wildcard(&s.name) {
        return Err(ErrorKind::Unsupported(
            "wildcards in subject names are not converted".to_owned(),
        ));
    }
    match s.kind.as_str() {
        "User" => Ok(format!(
            "request.userInfo.username == {}",
            cel_string(&s.name)
        )),
        "Group" => Ok(format!(
            "{} in request.userInfo.?groups.orValue([])",
            cel_string(&s.name)
        )),
        "ServiceAccount" => {
            let ns = s.namespace.as_deref().unwrap_or_default();
            Ok(format!(
                "request.userInfo.username == {}",
                cel_string(&format!("system:serviceaccount:{ns}:{}", s.name))
            ))
        }
        other => Err(ErrorKind::Invalid(format!(
            "kind {other:?}: User, Group or ServiceAccount expected"
        ))),
    }
}

/// CEL: `subject` equals one of `values`, each a go-wildcard pattern.
fn one_of(subject: &str, values: &[String]) -> String {
    let (patterns, exact): (Vec<&String>, Vec<&String>) =
        values.iter().partition(|v| has_wildcard(v));
    let mut parts = Vec::new();
    if !exact.is_empty() {
        let exact: Vec<String> = exact.into_iter().cloned().collect();
        parts.push(format!("{subject} in {}", cel_string_list(&exact)));
    }
    for p in patterns {
        parts.push(format!(
            "{subject}.matches({})",
            cel_string(&wildcard_to_regex(p))
        ));
    }
    parts.join(" || ")
}

fn filters_of(
    m: &MatchResources,
    at: &str,
    custom: &BTreeSet<String>,
) -> Result<(Vec<Filter>, bool), ConvertError> {
    let direct = m.resources.is_some() || !m.subjects.is_empty();
    let groups = [!m.any.is_empty(), !m.all.is_empty(), direct];
    if groups.iter().filter(|g| **g).count() > 1 {
        return Err(ConvertError::invalid(
            at,
            "any, all and resources cannot be combined",
        ));
    }
    if direct || !m.roles.is_empty() || !m.cluster_roles.is_empty() {
        let f = filter(
            m.resources.as_ref(),
            &m.subjects,
            &m.roles,
            &m.cluster_roles,
            at,
            custom,
        )?;
        return Ok((vec![f], true));
    }
    let (list, is_any, name) = if m.any.is_empty() {
        (&m.all, false, "all")
    } else {
        (&m.any, true, "any")
    };
    let mut out = Vec::new();
    for (i, f) in list.iter().enumerate() {
        out.push(filter_entry(f, &format!("{at}.{name}[{i}]"), custom)?);
    }
    Ok((out, is_any))
}

fn filter_entry(
    f: &ResourceFilter,
    at: &str,
    custom: &BTreeSet<String>,
) -> Result<Filter, ConvertError> {
    filter(
        f.resources.as_ref(),
        &f.subjects,
        &f.roles,
        &f.cluster_roles,
        at,
        custom,
    )
}

/// Converts `match`, `exclude` and `preconditions`. `custom` holds the kinds the rule's own
/// `imageExtractors` read: a rule naming one names only such kinds.
pub(crate) fn convert(
    match_: Option<&MatchResources>,
    exclude: Option<&MatchResources>,
    preconditions: Option<&Value>,
    custom: &BTreeSet<String>,
) -> Result<Matched, ConvertError> {
    let match_ = match_.ok_or_else(|| ConvertError::invalid("match", "Required value"))?;
    let (filters, is_any) = filters_of(match_, "match", custom)?;
    if filters.is_empty() {
        return Err(ConvertError::invalid(
            "match",
            "at least one filter is required",
        ));
    }
    let mut out = Matched::default();
    let first = &filters[0];
    let same_kinds = filters.iter().all(|f| f.kinds == first.kinds);
    let kinds: BTreeSet<String> = if is_any {
        filters
            .iter()
            .flat_map(|f| f.kinds.iter().cloned())
            .collect()
    } else {
        if !same_kinds {
            return Err(ConvertError::unsupported(
                "match.all",
                "filters naming different kinds are not converted",
            ));
        }
        first.kinds.clone()
    };
    if kinds.is_empty() {
        return Err(ConvertError::invalid(
            "match",
            "resources.kinds: Required value",
        ));
    }
    if !custom.is_empty() && kinds.iter().any(|k| gvr(k).is_some()) {
        return Err(ConvertError::unsupported(
            "match",
            "a rule with imageExtractors that also matches kinds whose containers an \
             ImageValidatingPolicy extracts is not converted (split the rule)",
        ));
    }
    let operations: BTreeSet<String> = filters
        .iter()
        .flat_map(|f| f.operations.iter().cloned())
        .collect();
    if filters.iter().any(|f| f.operations != first.operations) {
        return Err(ConvertError::unsupported(
            "match",
            "filters with different operations are not converted",
        ));
    }
    let conditions: Vec<Option<String>> = filters.iter().map(|f| f.condition.clone()).collect();
    let selectors: Vec<(Option<LabelSelector>, Option<LabelSelector>)> = filters
        .iter()
        .map(|f| (f.selector.clone(), f.namespace_selector.clone()))
        .collect();
    let has_constraints = conditions.iter().any(Option::is_some)
        || selectors.iter().any(|(a, b)| a.is_some() || b.is_some());
    if filters.len() > 1 && is_any && has_constraints {
        // `any` of filters: one OR of conditions is exact only when every filter names the
        // same kinds and no selectors (selectors cannot be OR-ed).
        if !same_kinds || selectors.iter().any(|(a, b)| a.is_some() || b.is_some()) {
            return Err(ConvertError::unsupported(
                "match.any",
                "several filters with different kinds or with selectors are not converted \
                 (split the rule)",
            ));
        }
        let ors: Vec<String> = conditions
            .iter()
            .map(|c| c.clone().unwrap_or_else(|| "true".to_owned()))
            .map(|c| format!("({c})"))
            .collect();
        out.conditions.push(("match".to_owned(), ors.join(" || ")));
    } else {
        for (i, c) in conditions.iter().enumerate() {
            if let Some(c) = c {
                let name = if filters.len() > 1 {
                    format!("match-{i}")
                } else {
                    "match".to_owned()
                };
                out.conditions.push((name, c.clone()));
            }
        }
        let mut object = None;
        let mut namespace = None;
        for (o, n) in selectors {
            if o.is_some() {
                if object.is_some() {
                    return Err(ConvertError::unsupported(
                        "match.all",
                        "several object selectors are not converted",
                    ));
                }
                object = o;
            }
            if n.is_some() {
                if namespace.is_some() {
                    return Err(ConvertError::unsupported(
                        "match.all",
                        "several namespace selectors are not converted",
                    ));
                }
                namespace = n;
            }
        }
        out.constraints.object_selector = object;
        out.constraints.namespace_selector = namespace;
    }
    let ops: Vec<String> = if operations.is_empty() {
        vec!["CREATE".to_owned(), "UPDATE".to_owned()]
    } else {
        operations.into_iter().collect()
    };
    out.constraints.resource_rules = resource_rules(&kinds, &ops);
    if let Some(exclude) = exclude {
        convert_exclude(exclude, &kinds, &mut out, custom)?;
    }
    if let Some(pre) = preconditions.filter(|p| !p.is_null()) {
        // `preconditions` is one block (`{any, all}`, or the older list of conditions): its
        // errors name the field from `preconditions` down.
        let cel = conditions::translate_block(pre, &request_path)
            .map_err(|e| e.under("preconditions"))?;
        out.conditions.push(("preconditions".to_owned(), cel));
    }
    Ok(out)
}

fn resource_rules(kinds: &BTreeSet<String>, ops: &[String]) -> Vec<NamedRuleWithOperations> {
    let mut rules: Vec<NamedRuleWithOperations> = Vec::new();
    for kind in kinds {
        let Some((g, v, r)) = gvr(kind) else {
            rules.extend(custom_resource_rule(kind, ops));
            continue;
        };
        match rules
            .iter_mut()
            .find(|rule| rule.api_groups == [g] && rule.api_versions == [v])
        {
            Some(rule) => rule.resources.push(r.to_owned()),
            None => rules.push(NamedRuleWithOperations {
                api_groups: vec![g.to_owned()],
                api_versions: vec![v.to_owned()],
                resources: vec![r.to_owned()],
                operations: ops.to_vec(),
                ..NamedRuleWithOperations::default()
            }),
        }
    }
    rules
}

fn convert_exclude(
    exclude: &MatchResources,
    match_kinds: &BTreeSet<String>,
    out: &mut Matched,
    custom: &BTreeSet<String>,
) -> Result<(), ConvertError> {
    let (filters, is_any) = filters_of(exclude, "exclude", custom)?;
    if !is_any && filters.len() > 1 {
        return Err(ConvertError::unsupported(
            "exclude.all",
            "several filters are not converted",
        ));
    }
    for (i, f) in filters.iter().enumerate() {
        let at = format!("exclude[{i}]");
        if f.selector.is_some() || f.namespace_selector.is_some() {
            return Err(ConvertError::unsupported(
                at,
                "selectors in exclude are not converted",
            ));
        }
        if !f.operations.is_empty() {
            return Err(ConvertError::unsupported(
                at,
                "operations in exclude are not converted",
            ));
        }
        let covers_all = f.kinds.is_empty() || match_kinds.is_subset(&f.kinds);
        let disjoint = !f.kinds.is_empty() && f.kinds.is_disjoint(match_kinds);
        if disjoint {
            continue;
        }
        match (&f.condition, covers_all) {
            (Some(c), true) => out
                .conditions
                .push((format!("exclude-{i}"), format!("!({c})"))),
            (None, true) => {
                return Err(ConvertError::unsupported(
                    at,
                    "excludes every resource the rule matches",
                ));
            }
            (None, false) => {
                let ops = out
                    .constraints
                    .resource_rules
                    .first()
                    .map(|r| r.operations.clone())
                    .unwrap_or_default();
                let kinds: BTreeSet<String> = f.kinds.intersection(match_kinds).cloned().collect();
                out.constraints
                    .exclude_resource_rules
                    .extend(resource_rules(&kinds, &ops));
            }
            (Some(_), false) => {
                return Err(ConvertError::unsupported(
                    at,
                    "a filter naming some of the matched kinds and other constraints is not \
                     converted (split the rule)",
                ));
            }
        }
    }
    Ok(())
}

/// `{{ request.… }}` paths in preconditions as CEL on the request.
fn request_path(path: &str) -> Result<String, ErrorKind> {
    let segments = conditions::split_path(path)?;
    let field = |i: usize| match segments.get(i) {
        Some(Segment::Field(f)) => Some(f.as_str()),
        _ => None,
    };
    let (root, skip) = match (field(0), field(1)) {
        (Some("request"), Some("object")) => ("object", 2),
        (Some("request"), Some("oldObject")) => ("oldObject", 2),
        (
            Some("request"),
            Some("operation" | "namespace" | "name" | "userInfo" | "kind" | "dryRun"),
        ) => ("request", 1),
        _ => {
            return Err(ErrorKind::Unsupported(format!(
                "{{{{ {path} }}}}: only request.object, request.oldObject, request.operation, \
                 request.namespace, request.name, request.kind and request.userInfo are converted"
            )));
        }
    };
    let rest: Vec<String> = segments[skip..]
        .iter()
        .map(|s| match s {
            Segment::Field(f) => format!("\"{f}\""),
            Segment::Index(i) => format!("[{i}]"),
        })
        .collect();
    let joined = rest.join(".").replace(".[", "[");
    if joined.is_empty() {
        return Ok(root.to_owned());
    }
    conditions::path_to_cel(root, &joined)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(v: Value) -> MatchResources {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pods_in_namespaces_with_an_excluded_namespace() {
        let out = convert(
            Some(&m(json!({"any": [{"resources": {"kinds": ["Pod"], "namespaces": ["shop", "team-*"]}}]}))),
            Some(&m(json!({"any": [{"resources": {"namespaces": ["team-legacy"]}}]}))),
            None,
            &BTreeSet::new(),
        )
        .unwrap();
        let rule = &out.constraints.resource_rules[0];
        assert_eq!(rule.resources, ["pods"]);
        assert_eq!(rule.operations, ["CREATE", "UPDATE"]);
        assert_eq!(
            out.conditions,
            [
                (
                    "match".to_owned(),
                    "(request.namespace in ['shop'] || request.namespace.matches('^team\\\\-.*$'))"
                        .to_owned()
                ),
                (
                    "exclude-0".to_owned(),
                    "!((request.namespace in ['team-legacy']))".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let e = convert(
            Some(&m(
                json!({"any": [{"resources": {"kinds": ["Pod"]}, "clusterRoles": ["admin"]}]}),
            )),
            None,
            None,
            &BTreeSet::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("match.any[0]: roles and clusterRoles"), "{e}");
        let e = convert(
            Some(&m(json!({"any": [{"resources": {"kinds": ["Service"]}}]}))),
            None,
            None,
            &BTreeSet::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"Service\" is not converted"), "{e}");
    }

    #[test]
    fn names_from_the_policy_stay_literals_in_cel() {
        use ivory_cel::{Activation, NoHost, Scope};
        for hostile in [
            "a' || true || 'b",
            "a\\' || true || '",
            "x*') || true || ('",
        ] {
            let cel = one_of("request.namespace", &[hostile.to_owned()]);
            let program = ivory_cel::compile(&cel, &Scope::new(["request"]))
                .unwrap_or_else(|e| panic!("{cel}: {e}"));
            let mut act = Activation::new(&NoHost);
            act.bind_json("request", &json!({"namespace": "other"}));
            assert!(!program.evaluate_bool(&act).unwrap(), "{cel}");
        }
    }

    #[test]
    fn precondition_refusals_name_the_condition() {
        let refuse = |pre: Value| {
            let pods = m(json!({"resources": {"kinds": ["Pod"]}}));
            convert(Some(&pods), None, Some(&pre), &BTreeSet::new())
                .unwrap_err()
                .path
                .to_string()
        };
        let bad =
            json!({"key": "{{ request.object | keys(@) }}", "operator": "Equals", "value": "a"});
        let ok = json!({"key": "{{ request.operation }}", "operator": "Equals", "value": "CREATE"});
        assert_eq!(
            refuse(json!({"all": [ok, bad]})),
            "preconditions.all[1].key"
        );
        // The older form, a list of conditions: each is named by its index, the first too.
        assert_eq!(refuse(json!([bad, ok])), "preconditions[0].key");
        assert_eq!(refuse(json!([ok, bad])), "preconditions[1].key");
    }

    #[test]
    fn preconditions_read_the_request() {
        let out = convert(
            Some(&m(json!({"resources": {"kinds": ["Pod", "apps/v1/Deployment"]}}))),
            None,
            Some(&json!({"all": [{"key": "{{ request.object.metadata.labels.team }}", "operator": "Equals", "value": "blue"}]})),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(out.constraints.resource_rules.len(), 2);
        assert_eq!(
            out.conditions[0].1,
            "((object.metadata.labels.team == 'blue'))"
        );
    }

    /// Kyverno's `ParseKindSelector` forms, and the resource rules of kinds a rule's own
    /// `imageExtractors` read.
    #[test]
    fn custom_kinds_become_resource_rules_in_any_group_unless_written() {
        let sel = |g, v, k, s| KindSelector {
            group: g,
            version: v,
            kind: k,
            subresource: s,
        };
        assert_eq!(kind_selector("TaskRun"), Some(sel("*", "*", "TaskRun", "")));
        assert_eq!(
            kind_selector("v1/TaskRun"),
            Some(sel("*", "v1", "TaskRun", ""))
        );
        assert_eq!(
            kind_selector("tekton.dev/v1beta1/TaskRun.status"),
            Some(sel("tekton.dev", "v1beta1", "TaskRun", "status"))
        );
        assert_eq!(
            kind_selector("TaskRun/status"),
            Some(sel("*", "*", "TaskRun", "status"))
        );
        assert_eq!(kind_selector("a/b/c/d/e"), None);
        assert_eq!(guessed_resource("PipelineRun"), "pipelineruns");
        assert_eq!(guessed_resource("Ingress"), "ingresses");
        assert_eq!(guessed_resource("Policy"), "policies");

        let custom: BTreeSet<String> = ["TaskRun".to_owned(), "PipelineRun".to_owned()].into();
        let out = convert(
            Some(&m(json!({"any": [{"resources": {"kinds": ["tekton.dev/v1beta1/TaskRun.status", "PipelineRun"]}}]}))),
            None,
            None,
            &custom,
        )
        .unwrap();
        let rules: Vec<_> = out
            .constraints
            .resource_rules
            .iter()
            .map(|r| {
                (
                    r.api_groups.clone(),
                    r.api_versions.clone(),
                    r.resources.clone(),
                )
            })
            .collect();
        assert_eq!(
            rules,
            [
                (
                    vec!["*".to_owned()],
                    vec!["*".to_owned()],
                    vec!["pipelineruns".to_owned()]
                ),
                (
                    vec!["tekton.dev".to_owned()],
                    vec!["v1beta1".to_owned()],
                    vec!["taskruns/status".to_owned()]
                ),
            ]
        );
        // Without extractors for it, or beside a Pod, a custom kind is refused.
        let refused = |kinds: Value| {
            convert(
                Some(&m(json!({"any": [{"resources": {"kinds": kinds}}]}))),
                None,
                None,
                &custom,
            )
            .unwrap_err()
            .to_string()
        };
        assert!(refused(json!(["Task"])).contains("\"Task\" is not converted"));
        assert!(refused(json!(["Pod", "TaskRun"])).contains("split the rule"));
    }
}

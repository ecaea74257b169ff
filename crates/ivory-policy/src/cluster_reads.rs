//! What a policy reads from the cluster through Kyverno's `resource` and `globalContext`
//! libraries, known before it runs: every call's `apiVersion` and `resource` (and a
//! `globalContext` call's entry name) must be string literals, so that ivory knows which
//! resources to watch, and which its service account must be allowed to read, from the
//! policies alone. A call that computes them is refused at load.

use std::collections::BTreeSet;

use ivory_cel::Program;
use ivory_cel::cluster_functions::{GLOBAL_CONTEXT_GET, RESOURCE_GET, RESOURCE_LIST};

/// Resources a policy may never read. Secrets: serving them would mean holding every Secret
/// of the watched namespaces in ivory's memory and letting any policy author copy one into a
/// message, an audit annotation or a report. (Kyverno allows it; ivory refuses on purpose.)
const REFUSED: [(&str, &str, &str); 1] = [(
    "",
    "secrets",
    "ivory does not read Secrets for policies: it would hold every Secret of the namespace in \
     memory, and a policy could copy one into a message, an annotation or a report",
)];

/// One kind of object a policy reads with `resource.Get`/`resource.List`: what ivory watches.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceRead {
    /// API group, `""` for the core group.
    pub group: String,
    /// API version (`v1`).
    pub version: String,
    /// Plural resource name (`configmaps`).
    pub resource: String,
    /// The one namespace the calls name, or `None` when a call reads any namespace (a
    /// namespace computed from the request, `""`, or a cluster-scoped resource).
    pub namespace: Option<String>,
}

impl ResourceRead {
    /// `apiVersion` as Kubernetes writes it: `v1`, `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether this read covers objects of `namespace` (`""`: cluster-scoped or every
    /// namespace).
    pub fn covers(&self, namespace: &str) -> bool {
        match &self.namespace {
            None => true,
            Some(ns) => ns == namespace,
        }
    }
}

impl std::fmt::Display for ResourceRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.api_version(), self.resource)?;
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => f.write_str(" in all namespaces"),
        }
    }
}

/// Everything one policy reads from the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterReads {
    /// `resource.Get`/`resource.List` targets.
    pub resources: BTreeSet<ResourceRead>,
    /// GlobalContextEntry names `globalContext.Get` reads.
    pub global_context: BTreeSet<String>,
}

impl ClusterReads {
    /// Whether the policy reads nothing from the cluster.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.global_context.is_empty()
    }

    /// Adds what `other` reads.
    pub fn extend(&mut self, other: &ClusterReads) {
        self.resources.extend(other.resources.iter().cloned());
        self.global_context
            .extend(other.global_context.iter().cloned());
    }
}

/// Splits `apiVersion` into group and version; `None` when it is not `version` or
/// `group/version`.
pub fn split_api_version(api_version: &str) -> Option<(&str, &str)> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    (word(version) && (group.is_empty() || word(group))).then_some((group, version))
}

/// Whether `program` calls any cluster-read function.
pub(crate) fn reads_cluster(program: &Program) -> bool {
    RESOURCE_GET
        .iter()
        .chain(&RESOURCE_LIST)
        .chain(&GLOBAL_CONTEXT_GET)
        .any(|name| program.calls_function(name))
}

/// A cluster-read call ivory cannot know before the policy runs, or may not serve; its text is
/// the policy error's reason (at the expression's field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClusterReadError {
    /// The call's arguments fit none of its forms (`form` lists them).
    #[error("{function}: found no matching overload (takes {form})")]
    Overload {
        function: &'static str,
        form: &'static str,
    },
    /// `apiVersion` or `resource` is computed.
    #[error(
        "{function}: apiVersion and resource must be string literals, so that ivory knows \
         which resources to watch from the policy alone"
    )]
    NotLiteral { function: &'static str },
    /// `apiVersion` is not `version` or `group/version`.
    #[error("{function}: apiVersion {api_version:?} is not `version` or `group/version`")]
    ApiVersion {
        function: &'static str,
        api_version: String,
    },
    /// A subresource (`pods/log`).
    #[error("{function}: subresources ({resource:?}) are not served from ivory's watch caches")]
    Subresource {
        function: &'static str,
        resource: String,
    },
    /// Not a plural, lower-case resource name.
    #[error("{function}: {resource:?} is not a resource name (plural, lower case: configmaps)")]
    ResourceName {
        function: &'static str,
        resource: String,
    },
    /// A resource ivory never reads for policies ([`REFUSED`]).
    #[error("{function}: reading {resource} is refused: {why}")]
    Refused {
        function: &'static str,
        resource: String,
        why: &'static str,
    },
    /// A `globalContext` call whose entry name is computed.
    #[error(
        "{function}: the entry name must be a string literal (ivory knows which \
         GlobalContextEntries to read from the policy alone)"
    )]
    EntryNotLiteral { function: &'static str },
}

/// Records what `program` reads into `reads`; a call ivory cannot know before it runs, or may
/// not serve, is returned as an error. `policy_namespace` is set for a
/// NamespacedImageValidatingPolicy, whose calls take no namespace argument.
pub(crate) fn record(
    program: &Program,
    policy_namespace: Option<&str>,
    reads: &mut ClusterReads,
) -> Vec<ClusterReadError> {
    let mut errors = Vec::new();
    for (names, get) in [(RESOURCE_GET, true), (RESOURCE_LIST, false)] {
        for name in names {
            for args in program.namespaced_calls(name) {
                match resource_read(name, get, args, policy_namespace) {
                    Ok(read) => {
                        reads.resources.insert(read);
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    for function in GLOBAL_CONTEXT_GET {
        for args in program.namespaced_calls(function) {
            match args.first() {
                Some(Some(entry)) if (1..=2).contains(&args.len()) => {
                    reads.global_context.insert(entry.clone());
                }
                Some(_) if (1..=2).contains(&args.len()) => {
                    errors.push(ClusterReadError::EntryNotLiteral { function });
                }
                _ => errors.push(ClusterReadError::Overload {
                    function,
                    form: "(entry) or (entry, projection)",
                }),
            }
        }
    }
    errors
}

fn resource_read(
    function: &'static str,
    get: bool,
    args: &[Option<String>],
    policy_namespace: Option<&str>,
) -> Result<ResourceRead, ClusterReadError> {
    let form = match (get, policy_namespace.is_some()) {
        (true, false) => "(apiVersion, resource, namespace, name)",
        (true, true) => "(apiVersion, resource, name) in a NamespacedImageValidatingPolicy",
        (false, false) => "(apiVersion, resource, namespace[, labels])",
        (false, true) => "(apiVersion, resource[, labels]) in a NamespacedImageValidatingPolicy",
    };
    let arity_ok = match (get, policy_namespace.is_some()) {
        (true, false) => args.len() == 4,
        (true, true) => args.len() == 3,
        (false, false) => (3..=4).contains(&args.len()),
        (false, true) => (2..=3).contains(&args.len()),
    };
    if !arity_ok {
        return Err(ClusterReadError::Overload { function, form });
    }
    let (Some(Some(api_version)), Some(Some(resource))) = (args.first(), args.get(1)) else {
        return Err(ClusterReadError::NotLiteral { function });
    };
    let Some((group, version)) = split_api_version(api_version) else {
        return Err(ClusterReadError::ApiVersion {
            function,
            api_version: api_version.clone(),
        });
    };
    if resource.contains('/') {
        return Err(ClusterReadError::Subresource {
            function,
            resource: resource.clone(),
        });
    }
    if resource.is_empty()
        || !resource
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    {
        return Err(ClusterReadError::ResourceName {
            function,
            resource: resource.clone(),
        });
    }
    if let Some(&(_, _, why)) = REFUSED
        .iter()
        .find(|(g, r, _)| *g == group && r == resource)
    {
        return Err(ClusterReadError::Refused {
            function,
            resource: resource.clone(),
            why,
        });
    }
    let namespace = match policy_namespace {
        Some(own) => Some(own.to_owned()),
        None => match args.get(2) {
            Some(Some(ns)) if !ns.is_empty() => Some(ns.clone()),
            _ => None,
        },
    };
    Ok(ResourceRead {
        group: group.to_owned(),
        version: version.to_owned(),
        resource: resource.clone(),
        namespace,
    })
}

//! What `ivory doctor` found: one [`Check`] per row, its [`Finding`] holding the facts, and
//! the verdict ([`Status`]) decided from the finding's kind, never from a text.

use std::path::PathBuf;
use std::time::Duration;

use ivory_policy::{DocumentError, PolicyError, ResourceRead};

use crate::webhooks::static_manifests::STATIC_SUFFIX;

/// A static manifest file larger than this is refused unread (ivory writes a few KiB).
pub(super) const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// Where the API server gets a webhook from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// A webhook configuration object of the API (it can be deleted through the API).
    Api,
    /// A static manifest file the API server reads (`.static.k8s.io`, not in the API).
    Static,
}

impl Source {
    /// Spelling in the report: `API` or `static`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "API",
            Self::Static => "static",
        }
    }
}

/// The verdict of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The layer works.
    Ok,
    /// The layer works, but not as the policies ask (or it could not be asked).
    Warn,
    /// The layer is broken: a policy is not enforced as written.
    Fail,
}

impl Status {
    /// Spelling in the report: `ok`, `WARN`, `FAIL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
        }
    }
}

/// The layer between a policy and its enforcement that a check looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// The kube-apiserver is reachable.
    Api,
    /// The policy CRDs are installed, serve `v1` and are Established.
    Crds,
    /// Each policy compiles.
    Policy,
    /// ivory's service account may watch what each policy reads.
    Reads,
    /// Webhooks call ivory for each policy.
    Registration,
    /// Each ivory endpoint of those webhooks answers `/readyz`.
    Endpoint,
}

impl Layer {
    /// Spelling in the report: `api`, `crds`, `policy`, `reads`, `registration`, `endpoint`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Crds => "crds",
            Self::Policy => "policy",
            Self::Reads => "reads",
            Self::Registration => "registration",
            Self::Endpoint => "endpoint",
        }
    }
}

/// One row of the report: what was checked and what was found.
#[derive(Debug)]
pub struct Check {
    /// What was checked: a CRD, a policy, `policy (stage)`, an endpoint.
    pub subject: String,
    /// What was found.
    pub finding: Finding,
}

impl Check {
    /// A row about `subject`.
    pub fn new(subject: impl Into<String>, finding: Finding) -> Self {
        Self {
            subject: subject.into(),
            finding,
        }
    }

    /// The layer the finding is about.
    pub fn layer(&self) -> Layer {
        self.finding.layer()
    }

    /// The verdict of the finding.
    pub fn status(&self) -> Status {
        self.finding.status()
    }
}

/// The facts one check found; its kind decides the [`Status`].
#[derive(Debug)]
pub enum Finding {
    /// The API server answered `/version`.
    ApiReached {
        /// Its `gitVersion`.
        version: String,
    },
    /// No client, or no answer to `/version`.
    ApiUnreachable(ConnectError),
    /// The CRD serves [`crate::kube_source::POLICY_VERSION`] and is Established.
    CrdReady,
    /// The CRD does not serve [`crate::kube_source::POLICY_VERSION`].
    CrdVersionNotServed,
    /// The CRD serves the version but is not Established.
    CrdNotEstablished,
    /// The CRD does not exist.
    CrdNotInstalled,
    /// The CRD could not be read.
    CrdUnreadable(kube::Error),
    /// The policy compiles.
    PolicyCompiles,
    /// The policy does not compile: ivory keeps serving without it.
    PolicyInvalid(Vec<PolicyError>),
    /// The policies of one kind could not be listed (the subject is the kind).
    PoliciesUnlisted(kube::Error),
    /// Neither policy kind has an object.
    NoPolicies,
    /// The service account may get, list and watch what the policy reads.
    ReadAllowed {
        /// What the policy reads.
        read: ResourceRead,
        /// The user asked about (`system:serviceaccount:NS:NAME`).
        service_account: String,
    },
    /// The service account may not use these watch verbs: every read of the policy fails and
    /// its failurePolicy decides.
    ReadDenied {
        /// What the policy reads.
        read: ResourceRead,
        /// The user asked about.
        service_account: String,
        /// The verbs refused, in the order asked.
        verbs: Vec<&'static str>,
    },
    /// A SubjectAccessReview failed, so whether the service account may read is unknown.
    ReadUnknown {
        /// What the policy reads.
        read: ResourceRead,
        /// The user asked about.
        service_account: String,
        /// The first verb whose review failed.
        verb: &'static str,
        /// Why it failed.
        error: kube::Error,
    },
    /// A webhook calls ivory for the policy at this stage, with the policy's failurePolicy.
    Registered {
        /// The webhook's name.
        webhook: String,
        /// The webhook configuration holding it.
        config: String,
        /// Its failurePolicy.
        failure_policy: String,
        /// Where it comes from (a static one is named when there is one).
        source: Source,
        /// `webhook in configuration` of an API webhook that also registers the policy,
        /// beside a static one.
        also_api: Option<String>,
    },
    /// A static and an API webhook both register the policy at this stage, differently: the
    /// API server calls both, so the stricter decides, and deleting the API one changes what
    /// is enforced.
    SourcesDisagree {
        /// The static webhook's name.
        static_webhook: String,
        /// The API webhook's name.
        api_webhook: String,
        /// What differs.
        differences: Vec<&'static str>,
    },
    /// The API server applies the static manifests of this folder, as they are on disk.
    StaticInForce {
        /// The plugin's folder.
        dir: PathBuf,
        /// Their hash, as the API server reports it.
        hash: String,
        /// How many of their webhooks call ivory.
        webhooks: usize,
    },
    /// The API server applies another version of this folder's manifests: an edit it has not
    /// read yet, or one it refused (its log says why; it keeps the last good version).
    StaticStale {
        /// The plugin's folder.
        dir: PathBuf,
        /// The hash of the files on disk (`None`: the folder holds none).
        on_disk: Option<String>,
        /// The hashes the API server reports applying.
        applied: Vec<String>,
    },
    /// The API server applies no static manifests for this plugin: it does not read the
    /// folder (no `--admission-control-config-file`, or the feature gate is off), so none of
    /// its webhooks is in force.
    StaticNotApplied {
        /// The plugin's folder.
        dir: PathBuf,
    },
    /// The API server applies static manifests for this plugin, and no folder was given to
    /// compare them with (`--static-manifests`).
    StaticUnread {
        /// The hashes it reports.
        hashes: Vec<String>,
    },
    /// The API server's metrics, which say what static manifests it applies, could not be read.
    StaticUnknown(String),
    /// The static manifest folder given could not be read.
    StaticUnreadable(StaticReadError),
    /// No webhook calls ivory for the policy at this stage: it exists but is not enforced.
    Unregistered {
        /// `validate` or `mutate`.
        stage: &'static str,
    },
    /// The webhook's failurePolicy is not the policy's.
    FailurePolicyDiffers {
        /// The webhook's name.
        webhook: String,
        /// The webhook's failurePolicy.
        webhook_says: String,
        /// The policy's failurePolicy (`Fail` or `Ignore`).
        policy_says: &'static str,
    },
    /// The webhook configurations could not be listed.
    WebhooksUnlisted(kube::Error),
    /// The endpoint answered `/readyz` with a success.
    EndpointReady {
        /// The answer's text.
        readyz: String,
        /// Policy load errors it counts ([`crate::READYZ_POLICY_ERRORS`]): they keep the last
        /// good version serving, so they warn, not fail.
        policy_errors: usize,
    },
    /// The endpoint failed to answer, or answered with an error.
    EndpointUnready(ProbeError),
    /// The endpoint did not answer in time (the API server will time out too).
    EndpointSilent {
        /// How long the probe waited.
        timeout: Duration,
    },
}

impl Finding {
    /// The layer this kind of finding is about.
    pub fn layer(&self) -> Layer {
        match self {
            Self::ApiReached { .. } | Self::ApiUnreachable(_) => Layer::Api,
            Self::CrdReady
            | Self::CrdVersionNotServed
            | Self::CrdNotEstablished
            | Self::CrdNotInstalled
            | Self::CrdUnreadable(_) => Layer::Crds,
            Self::PolicyCompiles
            | Self::PolicyInvalid(_)
            | Self::PoliciesUnlisted(_)
            | Self::NoPolicies => Layer::Policy,
            Self::ReadAllowed { .. } | Self::ReadDenied { .. } | Self::ReadUnknown { .. } => {
                Layer::Reads
            }
            Self::Registered { .. }
            | Self::Unregistered { .. }
            | Self::FailurePolicyDiffers { .. }
            | Self::SourcesDisagree { .. }
            | Self::StaticInForce { .. }
            | Self::StaticStale { .. }
            | Self::StaticNotApplied { .. }
            | Self::StaticUnread { .. }
            | Self::StaticUnknown(_)
            | Self::StaticUnreadable(_)
            | Self::WebhooksUnlisted(_) => Layer::Registration,
            Self::EndpointReady { .. } | Self::EndpointUnready(_) | Self::EndpointSilent { .. } => {
                Layer::Endpoint
            }
        }
    }

    /// The verdict: what works is ok; what works other than asked, or could not be asked,
    /// warns; what leaves a policy unenforced or unreachable fails.
    pub fn status(&self) -> Status {
        match self {
            Self::ApiReached { .. }
            | Self::CrdReady
            | Self::PolicyCompiles
            | Self::ReadAllowed { .. }
            | Self::Registered { .. }
            | Self::StaticInForce { .. }
            | Self::StaticUnread { .. } => Status::Ok,
            Self::EndpointReady { policy_errors, .. } if *policy_errors > 0 => Status::Warn,
            Self::EndpointReady { .. } => Status::Ok,
            Self::NoPolicies
            | Self::ReadUnknown { .. }
            | Self::FailurePolicyDiffers { .. }
            | Self::SourcesDisagree { .. }
            | Self::StaticStale { .. }
            | Self::StaticUnknown(_) => Status::Warn,
            Self::ApiUnreachable(_)
            | Self::CrdVersionNotServed
            | Self::CrdNotEstablished
            | Self::CrdNotInstalled
            | Self::CrdUnreadable(_)
            | Self::PolicyInvalid(_)
            | Self::PoliciesUnlisted(_)
            | Self::ReadDenied { .. }
            | Self::Unregistered { .. }
            | Self::StaticNotApplied { .. }
            | Self::StaticUnreadable(_)
            | Self::WebhooksUnlisted(_)
            | Self::EndpointUnready(_)
            | Self::EndpointSilent { .. } => Status::Fail,
        }
    }
}

/// Why the API server could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No client configuration (KUBECONFIG or in-cluster).
    #[error("connecting (KUBECONFIG or in-cluster config)")]
    Config(#[source] kube::Error),
    /// `/version` did not answer.
    #[error("reading /version")]
    Version(#[source] kube::Error),
}

/// Why an endpoint's `/readyz` did not answer with a success.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The webhook's caBundle is not PEM certificates.
    #[error("reading the webhook's caBundle")]
    CaBundle(#[source] reqwest::Error),
    /// A direct (URL webhook) request failed.
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    /// The service proxy request could not be built.
    #[error(transparent)]
    Request(#[from] http::Error),
    /// The API server's service proxy request failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// `/readyz` answered with an error status.
    #[error("/readyz answered {status}: {}", text.trim())]
    NotReady {
        /// The answer's status.
        status: http::StatusCode,
        /// The answer's text.
        text: String,
    },
    /// The API server's service proxy refused (no endpoints, forbidden), saying why in a
    /// Status object.
    #[error("{message} ({status})")]
    Refused {
        /// The answer's status.
        status: http::StatusCode,
        /// The Status object's message.
        message: String,
    },
}

/// Why a static manifest folder could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StaticReadError {
    /// A folder or file could not be read.
    #[error("reading {path}")]
    Io {
        /// The folder or file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A file is larger than the limit.
    #[error("{path}: larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// A file is not YAML or JSON.
    #[error("{path}")]
    Document {
        /// The file.
        path: PathBuf,
        /// What does not parse.
        #[source]
        source: DocumentError,
    },
    /// A document is not this plugin's configuration kind (the API server refuses the folder).
    #[error("{path}: {kind:?} in the {plugin} folder (the API server refuses the whole folder)")]
    Kind {
        /// The file.
        path: PathBuf,
        /// The document's kind.
        kind: String,
        /// The plugin whose folder it is in.
        plugin: &'static str,
    },
    /// A configuration's fields do not decode.
    #[error("{path}: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
    /// A configuration's name lacks the reserved suffix (the API server refuses the folder).
    #[error(
        "{path}: {name:?} does not end with {STATIC_SUFFIX:?} (the API server refuses the whole folder)"
    )]
    Name {
        /// The file.
        path: PathBuf,
        /// The configuration's name.
        name: String,
    },
}

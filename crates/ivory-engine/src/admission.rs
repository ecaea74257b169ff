//! `admission.k8s.io/v1` AdmissionReview wire types, written by hand rather than taken from
//! kube-core: kube-core serializes `patch` as a byte array instead of the base64 string the API
//! documents (kube-rs#1781), and ivory needs the raw `object`/`oldObject` JSON anyway.

use std::collections::BTreeMap;

use base64::Engine as _;
use ivory_plumbing::{json_read, json_text};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use thiserror::Error;

use crate::decision::{Decision, PatchOp};

/// The only AdmissionReview version ivory accepts (the one Kyverno registers).
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// `kind` of every AdmissionReview.
pub const KIND: &str = "AdmissionReview";
/// `patchType` of every mutating response.
pub const PATCH_TYPE_JSON_PATCH: &str = "JSONPatch";
/// HTTP status code carried by a denial (what `kubectl` shows as `Forbidden`).
pub const DENY_CODE: u16 = 403;
/// `metav1.Status.reason` carried by a denial.
pub const DENY_REASON: &str = "Forbidden";

/// Why a request body is not a usable AdmissionReview.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AdmissionError {
    /// The body is not JSON, or not shaped like an AdmissionReview.
    #[error("invalid AdmissionReview JSON at line {line} column {column}: {message}")]
    InvalidJson {
        /// 1-based line of the first error.
        line: usize,
        /// 1-based column of the first error.
        column: usize,
        /// serde_json's description of it.
        message: String,
    },
    /// An apiVersion other than `admission.k8s.io/v1`.
    #[error("unsupported AdmissionReview apiVersion {found:?}: only {API_VERSION} is accepted")]
    UnsupportedVersion {
        /// The apiVersion the body declared (empty when absent).
        found: String,
    },
    /// A kind other than `AdmissionReview`.
    #[error("unexpected kind {found:?}: expected {KIND}")]
    WrongKind {
        /// The kind the body declared.
        found: String,
    },
    /// A review without the `request` the API server always sends.
    #[error("AdmissionReview has no request")]
    MissingRequest,
}

/// `Result` with [`AdmissionError`].
pub type Result<T, E = AdmissionError> = std::result::Result<T, E>;

/// `metav1.GroupVersionKind` as AdmissionRequest spells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupVersionKind {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version within the group (`v1`).
    #[serde(default)]
    pub version: String,
    /// The kind (`Pod`).
    #[serde(default)]
    pub kind: String,
}

/// `metav1.GroupVersionResource` as AdmissionRequest spells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupVersionResource {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version within the group (`v1`).
    #[serde(default)]
    pub version: String,
    /// The plural resource name (`pods`), as resource rules list it.
    #[serde(default)]
    pub resource: String,
}

impl GroupVersionResource {
    /// Convenience constructor (tests, extractor tables).
    pub fn new(group: &str, version: &str, resource: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
        }
    }
}

/// The admission operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    /// `CONNECT` (exec, attach, port-forward).
    Connect,
    /// `CREATE`.
    #[default]
    Create,
    /// `DELETE`: only `oldObject` is set.
    Delete,
    /// `UPDATE`: both `object` and `oldObject` are set.
    Update,
}

impl Operation {
    /// The wire spelling (`CREATE`, …), as resource rules list it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "CONNECT",
            Self::Create => "CREATE",
            Self::Delete => "DELETE",
            Self::Update => "UPDATE",
        }
    }
}

/// `authenticationv1.UserInfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    /// The requesting user's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    /// The user's unique id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The groups the user belongs to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Extra attributes the authenticator provided.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// `admission.k8s.io/v1` AdmissionRequest. `object`/`oldObject` stay raw JSON: policies
/// address arbitrary kinds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Identifies this call; the response must echo it.
    pub uid: String,
    /// The kind of `object`, possibly converted to the version the webhook registered for.
    pub kind: GroupVersionKind,
    /// The resource being admitted, in the webhook's registered version.
    pub resource: GroupVersionResource,
    /// The sub-resource (`ephemeralcontainers`, `status`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_resource: Option<String>,
    /// The kind the client sent, before any conversion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_kind: Option<GroupVersionKind>,
    /// The resource the client addressed, before any conversion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_resource: Option<GroupVersionResource>,
    /// The sub-resource the client addressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_sub_resource: Option<String>,
    /// Empty when the API server generates the name (`generateName`).
    #[serde(default)]
    pub name: String,
    /// Empty for cluster-scoped resources; the namespace's own name for Namespace objects.
    #[serde(default)]
    pub namespace: String,
    /// What the client is doing.
    pub operation: Operation,
    /// Who is doing it.
    #[serde(default)]
    pub user_info: UserInfo,
    /// `None` when absent or `null` (DELETE).
    #[serde(default, deserialize_with = "object::null_as_none")]
    pub object: Option<AdmittedObject>,
    /// `None` when absent or `null` (CREATE, CONNECT).
    #[serde(default, deserialize_with = "object::null_as_none")]
    pub old_object: Option<AdmittedObject>,
    /// True when nothing will be persisted (`kubectl --dry-run=server`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// The operation's options object (`CreateOptions`, `UpdateOptions`, ...).
    #[serde(default, deserialize_with = "null_as_none")]
    pub options: Option<Value>,
    /// Not part of the wire format: set by the server when the labels of the request's
    /// Namespace cannot be known (no Namespace watch, or a Namespace neither watched nor read
    /// in time). `matchConstraints.namespaceSelector` is then left to the API server, which
    /// evaluated it already: the generated webhook of such a policy carries it.
    #[serde(skip)]
    pub namespace_labels_unknown: bool,
}

fn null_as_none<'de, D>(d: D) -> Result<Option<Value>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let v = Option::<Value>::deserialize(d)?;
    Ok(v.filter(|v| !v.is_null()))
}

impl AdmissionRequest {
    /// The sub-resource of the original request (empty string when none).
    pub fn sub_resource(&self) -> &str {
        self.sub_resource.as_deref().unwrap_or("")
    }

    /// The resource the client addressed (`requestResource`, falling back to `resource`).
    pub fn original_resource(&self) -> &GroupVersionResource {
        self.request_resource.as_ref().unwrap_or(&self.resource)
    }

    /// The object policies look at: `object`, or `oldObject` when there is none (DELETE).
    pub fn subject(&self) -> Option<&AdmittedObject> {
        self.object.as_ref().or(self.old_object.as_ref())
    }

    /// The request namespace, `None` for cluster-scoped requests.
    pub fn namespace(&self) -> Option<&str> {
        Some(self.namespace.as_str()).filter(|ns| !ns.is_empty())
    }

    /// The request as the CEL `request` variable sees it (the AdmissionRequest JSON).
    pub fn to_json(&self) -> Value {
        // Serializing plain data with string keys cannot fail; fall back to null regardless.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A parsed incoming AdmissionReview (`request` is guaranteed present).
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionReview {
    /// The request to decide on.
    pub request: AdmissionRequest,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawReview {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    request: Option<AdmissionRequest>,
}

impl RawReview {
    /// Tells objects summarized in place where their raw JSON is.
    fn attach_body(&mut self, bytes: &[u8]) {
        let Some(request) = self.request.as_mut() else {
            return;
        };
        if request.object.is_none() && request.old_object.is_none() {
            return;
        }
        let body: std::sync::Arc<[u8]> = std::sync::Arc::from(bytes);
        if let Some(object) = request.object.as_mut() {
            object.attach_body(&body, object::Which::Object);
        }
        if let Some(object) = request.old_object.as_mut() {
            object.attach_body(&body, object::Which::OldObject);
        }
    }
}

impl AdmissionReview {
    /// Parses a request body. Only `admission.k8s.io/v1` is accepted.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        // Read as text checked once: serde_json reading bytes checks every string's UTF-8 on its
        // own (BENCHMARKS.md, issue 27's third round); a body that is not UTF-8 is refused by
        // the second parse below, which says where.
        // The fast reader first (`ivory_plumbing::json_read`: what it reads, serde_json reads the
        // same); what it leaves, serde_json.
        let one_pass = std::str::from_utf8(bytes).map(|text| {
            object::summarizing_in_place(|| match json_read::from_str::<RawReview>(text) {
                Ok(review) => Ok(review),
                Err(_) => serde_json::from_str::<RawReview>(text).map_err(|_| ()),
            })
        });
        let raw = match one_pass {
            Ok(Ok(mut review)) => {
                review.attach_body(bytes);
                review
            }
            // Invalid, or an object the summary refuses: read as raw JSON, which says which.
            Ok(Err(_)) | Err(_) => {
                serde_json::from_slice(bytes).map_err(|e| AdmissionError::InvalidJson {
                    line: e.line(),
                    column: e.column(),
                    message: e.to_string(),
                })?
            }
        };
        let version = raw.api_version.unwrap_or_default();
        if version != API_VERSION {
            return Err(AdmissionError::UnsupportedVersion { found: version });
        }
        if let Some(kind) = raw.kind.filter(|k| k != KIND) {
            return Err(AdmissionError::WrongKind { found: kind });
        }
        let request = raw.request.ok_or(AdmissionError::MissingRequest)?;
        Ok(Self { request })
    }
}

/// `metav1.Status` subset sent with a denial.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseStatus {
    /// Always `Failure`.
    pub status: String,
    /// What the client sees after `denied the request:`.
    pub message: String,
    /// HTTP status code ([`DENY_CODE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// Machine-readable reason ([`DENY_REASON`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `admission.k8s.io/v1` AdmissionResponse.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's `uid`, echoed.
    pub uid: String,
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Present only when the request is denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResponseStatus>,
    /// Shown to the client (`Warning:` lines in kubectl), allowed or not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Added to the API server's audit event for this request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
    /// `JSONPatch` whenever `patch` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Base64 (standard alphabet) of the JSON patch array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

impl AdmissionResponse {
    /// The bytes of the response's strings: what its JSON text is sized by.
    fn text_len(&self) -> usize {
        let status = self.status.as_ref().map_or(0, |s| {
            s.status.len() + s.message.len() + s.reason.as_ref().map_or(0, String::len)
        });
        let warnings: usize = self.warnings.iter().map(String::len).sum();
        let annotations: usize = self
            .audit_annotations
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        let patch = self.patch.as_ref().map_or(0, String::len);
        self.uid.len() + status + warnings + annotations + patch
    }
}

/// The RFC 6902 document for `ops`: one `replace` per op.
pub fn patch_json(ops: &[PatchOp]) -> Value {
    Value::Array(
        ops.iter()
            .map(|op| json!({"op": "replace", "path": op.path, "value": op.value}))
            .collect(),
    )
}

/// Builds the response for `req` from the engine's decision. A denial carries
/// `status {status: Failure, message, code: 403, reason: Forbidden}` and never a patch; an
/// allowed decision with patch ops carries `patchType: JSONPatch` and the base64 patch.
pub fn response_from_decision(req: &AdmissionRequest, d: &Decision) -> AdmissionResponse {
    let mut resp = AdmissionResponse {
        uid: req.uid.clone(),
        allowed: d.allowed,
        warnings: d.warnings.clone(),
        audit_annotations: d.audit_annotations.clone(),
        ..AdmissionResponse::default()
    };
    if !d.allowed {
        resp.status = Some(ResponseStatus {
            status: "Failure".to_owned(),
            message: d
                .message
                .clone()
                .unwrap_or_else(|| "denied by ivory".to_owned()),
            code: Some(DENY_CODE),
            reason: Some(DENY_REASON.to_owned()),
        });
    } else if !d.patch.is_empty() {
        let bytes = patch_json(&d.patch).to_string();
        resp.patch_type = Some(PATCH_TYPE_JSON_PATCH.to_owned());
        resp.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    resp
}

/// A response wrapped in `{apiVersion: admission.k8s.io/v1, kind: AdmissionReview, response}`,
/// written straight to the wire without a JSON tree ([`ReviewResponse::to_json`]). Its serde
/// derive is what the tests and the `admission_review` fuzz target hold that text to.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: &'a AdmissionResponse,
}

impl<'a> ReviewResponse<'a> {
    /// The review around `response`.
    pub fn new(response: &'a AdmissionResponse) -> Self {
        Self {
            api_version: API_VERSION,
            kind: KIND,
            response,
        }
    }

    /// The review as JSON text: what `serde_json::to_string` of it writes, byte for byte, with
    /// strings escaped by [`json_text`] (the response's annotations, warnings and message are
    /// most of its bytes).
    pub fn to_json(&self) -> String {
        use json_text::push_string as string;
        let r = self.response;
        let mut out = String::with_capacity(r.text_len() + r.text_len() / 8 + 192);
        out.push_str("{\"apiVersion\":");
        string(&mut out, self.api_version);
        out.push_str(",\"kind\":");
        string(&mut out, self.kind);
        out.push_str(",\"response\":{\"uid\":");
        string(&mut out, &r.uid);
        out.push_str(if r.allowed {
            ",\"allowed\":true"
        } else {
            ",\"allowed\":false"
        });
        if let Some(status) = &r.status {
            out.push_str(",\"status\":");
            status.push_json(&mut out);
        }
        if !r.warnings.is_empty() {
            out.push_str(",\"warnings\":");
            json_text::push_list(&mut out, &r.warnings);
        }
        if !r.audit_annotations.is_empty() {
            out.push_str(",\"auditAnnotations\":");
            json_text::push_map(&mut out, &r.audit_annotations);
        }
        for (name, value) in [("patchType", &r.patch_type), ("patch", &r.patch)] {
            if let Some(value) = value {
                out.push_str(",\"");
                out.push_str(name);
                out.push_str("\":");
                string(&mut out, value);
            }
        }
        out.push_str("}}");
        out
    }
}

impl ResponseStatus {
    /// Appends the status as JSON, as its serde derive writes it.
    fn push_json(&self, out: &mut String) {
        use json_text::push_string as string;
        out.push_str("{\"status\":");
        string(out, &self.status);
        out.push_str(",\"message\":");
        string(out, &self.message);
        if let Some(code) = self.code {
            out.push_str(",\"code\":");
            json_text::push_u64(out, u64::from(code));
        }
        if let Some(reason) = &self.reason {
            out.push_str(",\"reason\":");
            string(out, reason);
        }
        out.push('}');
    }
}

pub mod object;
pub mod shape;

pub use self::object::AdmittedObject;

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests;

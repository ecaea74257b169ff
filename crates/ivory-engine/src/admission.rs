//! `admission.k8s.io/v1` AdmissionReview wire types, written by hand rather than taken from
//! kube-core: kube-core serializes `patch` as a byte array instead of the base64 string the API
//! documents (kube-rs#1781), and ivory needs the raw `object`/`oldObject` JSON anyway.

use std::collections::BTreeMap;

use base64::Engine as _;
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
    #[error("invalid AdmissionReview JSON at line {line} column {column}: {message}")]
    InvalidJson {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("unsupported AdmissionReview apiVersion {found:?}: only {API_VERSION} is accepted")]
    UnsupportedVersion { found: String },
    #[error("unexpected kind {found:?}: expected {KIND}")]
    WrongKind { found: String },
    #[error("AdmissionReview has no request")]
    MissingRequest,
}

pub type Result<T, E = AdmissionError> = std::result::Result<T, E>;

/// `metav1.GroupVersionKind` as AdmissionRequest spells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// `metav1.GroupVersionResource` as AdmissionRequest spells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
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
    Connect,
    #[default]
    Create,
    Delete,
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
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// `admission.k8s.io/v1` AdmissionRequest. `object`/`oldObject` stay raw JSON: policies
/// address arbitrary kinds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_kind: Option<GroupVersionKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_resource: Option<GroupVersionResource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_sub_resource: Option<String>,
    /// Empty when the API server generates the name (`generateName`).
    #[serde(default)]
    pub name: String,
    /// Empty for cluster-scoped resources; the namespace's own name for Namespace objects.
    #[serde(default)]
    pub namespace: String,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    /// `None` when absent or `null` (DELETE).
    #[serde(default, deserialize_with = "null_as_none")]
    pub object: Option<Value>,
    /// `None` when absent or `null` (CREATE, CONNECT).
    #[serde(default, deserialize_with = "null_as_none")]
    pub old_object: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
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
    pub fn subject(&self) -> Option<&Value> {
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

impl AdmissionReview {
    /// Parses a request body. Only `admission.k8s.io/v1` is accepted.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let raw: RawReview =
            serde_json::from_slice(bytes).map_err(|e| AdmissionError::InvalidJson {
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            })?;
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
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `admission.k8s.io/v1` AdmissionResponse.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    /// Present only when the request is denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResponseStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
    /// `JSONPatch` whenever `patch` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Base64 (standard alphabet) of the JSON patch array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
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

/// Wraps a response in `{apiVersion: admission.k8s.io/v1, kind: AdmissionReview, response}`.
pub fn review_response(resp: &AdmissionResponse) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "response": resp,
    })
}

pub mod shape;

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests;

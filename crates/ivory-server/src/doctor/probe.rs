//! The `endpoint` layer: each ivory endpoint the webhooks call answers `/readyz`, within
//! [`PROBE_TIMEOUT`].

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status as ApiStatus;

use super::check::{Check, Finding, ProbeError};
use super::hooks::{Endpoint, Hook};
use crate::READYZ_POLICY_ERRORS;

/// How long one endpoint probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One row per distinct endpoint of `hooks`.
pub(super) async fn endpoint_checks(client: &kube::Client, hooks: &[Hook]) -> Vec<Check> {
    let endpoints: BTreeSet<&Endpoint> = hooks.iter().map(|h| &h.endpoint).collect();
    let mut checks = Vec::new();
    for endpoint in endpoints {
        let probed = tokio::time::timeout(PROBE_TIMEOUT, probe(client, endpoint)).await;
        let finding = match probed {
            Ok(Ok(ready)) => Finding::EndpointReady {
                readyz: ready.text,
                policy_errors: ready.policy_errors,
            },
            Ok(Err(e)) => Finding::EndpointUnready(e),
            Err(_) => Finding::EndpointSilent {
                timeout: PROBE_TIMEOUT,
            },
        };
        checks.push(Check::new(endpoint.describe(), finding));
    }
    checks
}

/// A ready endpoint's `/readyz` answer.
struct Ready {
    /// The text, for people.
    text: String,
    /// How many policy files or objects failed to load (the server's
    /// [`READYZ_POLICY_ERRORS`] header).
    policy_errors: usize,
}

/// GET `/readyz`: directly for URL webhooks (trusting only their caBundle), through the API
/// server's service proxy for Service webhooks.
async fn probe(client: &kube::Client, endpoint: &Endpoint) -> Result<Ready, ProbeError> {
    match endpoint {
        Endpoint::Url { base, ca } => {
            let mut builder = reqwest::Client::builder().timeout(PROBE_TIMEOUT);
            if !ca.is_empty() {
                let cert = reqwest::Certificate::from_pem(ca).map_err(ProbeError::CaBundle)?;
                builder = builder.tls_certs_only([cert]);
            }
            let response = builder
                .build()?
                .get(format!("{base}/readyz"))
                .send()
                .await?;
            let status = response.status();
            let policy_errors = policy_errors(response.headers());
            let text = response.text().await?;
            if !status.is_success() {
                return Err(ProbeError::NotReady { status, text });
            }
            Ok(Ready {
                text,
                policy_errors,
            })
        }
        Endpoint::Service {
            namespace,
            name,
            port,
        } => {
            let path =
                format!("/api/v1/namespaces/{namespace}/services/https:{name}:{port}/proxy/readyz");
            let request = http::Request::get(path).body(kube::client::Body::empty())?;
            let response = client.send(request).await?;
            let status = response.status();
            let policy_errors = policy_errors(response.headers());
            let body = response.into_body().collect_bytes().await?;
            let text = String::from_utf8_lossy(&body).into_owned();
            if !status.is_success() {
                // The API server's own refusals (no endpoints, forbidden) are Status objects.
                let status_message = serde_json::from_str::<ApiStatus>(&text)
                    .ok()
                    .and_then(|s| s.message)
                    .filter(|m| !m.is_empty());
                return Err(match status_message {
                    Some(message) => ProbeError::Refused { status, message },
                    None => ProbeError::NotReady { status, text },
                });
            }
            Ok(Ready {
                text,
                policy_errors,
            })
        }
    }
}

/// The server's count of policy load errors; absent or unreadable counts as none.
fn policy_errors(headers: &http::HeaderMap) -> usize {
    headers
        .get(READYZ_POLICY_ERRORS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

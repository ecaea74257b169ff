//! The `reads` layer: whether ivory's service account may get, list and watch what each
//! policy reads through `resource.Get`/`List` and `globalContext.Get` (a SubjectAccessReview
//! per verb).

use ivory_policy::{CompiledPolicy, ResourceRead};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::check::{Check, Finding};

/// Verbs ivory's watches need.
const WATCH_VERBS: [&str; 3] = ["get", "list", "watch"];

/// What each policy reads from the cluster (its `resource.*` calls, and GlobalContextEntries,
/// which ivory reads as `kyverno.io` `globalcontextentries`), by policy subject.
pub fn reads_needed(policies: &[CompiledPolicy]) -> Vec<(String, ResourceRead)> {
    let mut out = Vec::new();
    for p in policies {
        let subject = match &p.namespace {
            Some(ns) => format!("{:?}/{ns}/{}", p.kind, p.name),
            None => format!("{:?}/{}", p.kind, p.name),
        };
        for read in &p.cluster_reads.resources {
            out.push((subject.clone(), read.clone()));
        }
        if !p.cluster_reads.global_context.is_empty() {
            out.push((
                subject.clone(),
                ResourceRead {
                    group: "kyverno.io".into(),
                    version: "v2beta1".into(),
                    resource: "globalcontextentries".into(),
                    namespace: None,
                },
            ));
        }
    }
    out
}

/// One row per (policy, resource read) from the answers to each watch verb: allowed when
/// every verb is, unknown when a review failed, else denied with the verbs refused (the
/// policy's reads fail, and its failurePolicy decides every request it judges).
pub fn read_check(
    subject: &str,
    read: &ResourceRead,
    service_account: &str,
    answers: impl IntoIterator<Item = (&'static str, Result<bool, kube::Error>)>,
) -> Check {
    let mut denied = Vec::new();
    let mut failed = None;
    for (verb, answer) in answers {
        match answer {
            Ok(false) => denied.push(verb),
            Ok(true) => {}
            Err(error) => {
                failed.get_or_insert((verb, error));
            }
        }
    }
    let read = read.clone();
    let service_account = service_account.to_owned();
    let finding = match failed {
        Some((verb, error)) => Finding::ReadUnknown {
            read,
            service_account,
            verb,
            error,
        },
        None if denied.is_empty() => Finding::ReadAllowed {
            read,
            service_account,
        },
        None => Finding::ReadDenied {
            read,
            service_account,
            verbs: denied,
        },
    };
    Check::new(subject, finding)
}

/// A row per (policy, resource read), asking the API server about each watch verb.
pub(super) async fn read_checks(
    client: &kube::Client,
    service_account: &str,
    policies: &[CompiledPolicy],
) -> Vec<Check> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let mut checks = Vec::new();
    for (subject, read) in reads_needed(policies) {
        let mut answers = Vec::new();
        for verb in WATCH_VERBS {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(service_account.to_owned()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(read.group.clone()),
                        version: Some(read.version.clone()),
                        resource: Some(read.resource.clone()),
                        namespace: read.namespace.clone(),
                        verb: Some(verb.to_owned()),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map(|r| r.status.is_some_and(|s| s.allowed));
            answers.push((verb, answer));
        }
        checks.push(read_check(&subject, &read, service_account, answers));
    }
    checks
}

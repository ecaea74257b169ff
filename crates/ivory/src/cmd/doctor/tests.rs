use ivory_server::doctor::{read_check, reads_needed};

use super::*;

#[test]
fn the_table_ends_with_the_verdict() {
    let ok = [Check::new(
        "kube-apiserver",
        Finding::ApiReached {
            version: "v1.37.2".into(),
        },
    )];
    let text = render(&ok);
    assert!(text.starts_with("LAYER"), "{text}");
    assert!(
        text.contains("api    kube-apiserver  ok      v1.37.2"),
        "{text}"
    );
    assert!(text.ends_with("all layers ok\n"), "{text}");
    let failed = [Check::new(
        "p (validate)",
        Finding::Unregistered { stage: "validate" },
    )];
    assert!(render(&failed).ends_with("1 check(s) failed\n"));
    let warned = [Check::new(
        "ValidatingAdmissionWebhook",
        Finding::StaticUnknown("forbidden".into()),
    )];
    assert!(render(&warned).ends_with("no check failed; 1 warning(s)\n"));
}

#[test]
fn a_policy_reading_what_the_service_account_may_not_watch_fails_its_row() {
    let text = "apiVersion: policies.kyverno.io/v1
kind: NamespacedImageValidatingPolicy
metadata:
  name: keys
  namespace: team-a
spec:
  matchConstraints:
    resourceRules:
      - apiGroups: [\"\"]
        apiVersions: [v1]
        operations: [CREATE]
        resources: [pods]
  attestors: []
  validations:
    - expression: resource.get('v1', 'configmaps', 'keys') != null && globalContext.Get('trusted', '') != null
";
    let report = ivory_policy::load_str(text, "test");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let needed = reads_needed(&report.policies);
    let described: Vec<(String, String)> = needed
        .iter()
        .map(|(s, r)| (s.clone(), r.to_string()))
        .collect();
    assert_eq!(
        described,
        [
            (
                "NamespacedImageValidatingPolicy/team-a/keys".to_owned(),
                "v1 configmaps in namespace team-a".to_owned()
            ),
            (
                "NamespacedImageValidatingPolicy/team-a/keys".to_owned(),
                "kyverno.io/v2beta1 globalcontextentries in all namespaces".to_owned()
            ),
        ]
    );
    let sa = "system:serviceaccount:ivory-system:ivory";
    let (subject, read) = &needed[0];
    let all = [("get", Ok(true)), ("list", Ok(true)), ("watch", Ok(true))];
    assert_eq!(read_check(subject, read, sa, all).status(), Status::Ok);
    let no_watch = [("get", Ok(true)), ("list", Ok(false)), ("watch", Ok(false))];
    let row = read_check(subject, read, sa, no_watch);
    assert_eq!(row.status(), Status::Fail);
    assert!(
        detail(&row).contains("may not list, watch it"),
        "{}",
        detail(&row)
    );
    let refused = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
    let unknown = [
        ("get", Err(kube::Error::Api(refused.boxed()))),
        ("list", Ok(true)),
        ("watch", Ok(true)),
    ];
    let row = read_check(subject, read, sa, unknown);
    assert_eq!(row.status(), Status::Warn);
    assert!(
        detail(&row).contains(&format!("could not ask whether {sa} may get it: ")),
        "{}",
        detail(&row)
    );
}

#[test]
fn findings_are_worded_as_before_and_errors_with_their_causes() {
    use ivory_server::doctor::{ConnectError, ProbeError};
    let worded = |finding| detail(&Check::new("s", finding));
    assert_eq!(worded(Finding::CrdReady), "v1 served, Established");
    assert_eq!(
        worded(Finding::CrdVersionNotServed),
        "version v1 is not served"
    );
    assert_eq!(
        worded(Finding::CrdNotInstalled),
        "not installed (kubectl apply -k deploy/crds)"
    );
    assert_eq!(
        worded(Finding::Unregistered { stage: "mutate" }),
        "no mutate webhook calls ivory for this policy: it exists but is not enforced \
         (register `ivory webhooks`)"
    );
    assert_eq!(
        worded(Finding::FailurePolicyDiffers {
            webhook: "w".into(),
            webhook_says: "Ignore".into(),
            policy_says: "Fail",
        }),
        "webhook w has failurePolicy Ignore, the policy says Fail"
    );
    assert_eq!(
        worded(Finding::EndpointReady {
            readyz: "ready\n  policies: 2\n".into(),
            policy_errors: 0,
        }),
        "/readyz: ready | policies: 2"
    );
    assert_eq!(
        worded(Finding::EndpointSilent {
            timeout: ivory_server::doctor::PROBE_TIMEOUT,
        }),
        "no answer within 5s (the API server will time out too)"
    );
    assert_eq!(
        worded(Finding::EndpointUnready(ProbeError::NotReady {
            status: http::StatusCode::SERVICE_UNAVAILABLE,
            text: " not ready \n".into(),
        })),
        "/readyz answered 503 Service Unavailable: not ready"
    );
    // The causes, as anyhow's `{:#}` wrote them when the binary held the errors.
    let refused = || {
        let status = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
        ConnectError::Version(kube::Error::Api(status.boxed()))
    };
    let text = worded(Finding::ApiUnreachable(refused()));
    assert_eq!(text, format!("{:#}", anyhow::Error::new(refused())));
    assert!(text.starts_with("reading /version: "), "{text}");
}

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::{Activation, CompileError, CostBudget, EvalError, NoHost, Scope, Value, compile};

fn scope() -> Scope {
    Scope::new([
        "object",
        "request",
        "images",
        "variables",
        "attestors",
        "attestations",
    ])
    .policy_defined(["attestors", "attestations"])
}

fn too_costly(src: &str) -> CompileError {
    match compile(src, &scope()) {
        Err(e @ CompileError::TooCostly { .. }) => e,
        Err(other) => panic!("{src}: expected TooCostly, got {other}"),
        Ok(p) => panic!("{src}: accepted, estimated {}", p.estimated_cost()),
    }
}

fn accepted(src: &str) -> crate::Program {
    compile(src, &scope()).unwrap_or_else(|e| panic!("{src}: {e}"))
}

/// An object with `items`: `n` small integers.
fn object_with_items(n: usize) -> serde_json::Value {
    json!({"items": (0..n).collect::<Vec<_>>(), "name": "x"})
}

fn evaluate_on(src: &str, object: &serde_json::Value) -> Result<Value, EvalError> {
    let mut act = Activation::new(&NoHost);
    act.bind_json("object", object);
    accepted(src).evaluate(&act)
}

fn assert_cost_exceeded(result: Result<Value, EvalError>, src: &str, reason: &str) {
    match result {
        Err(EvalError::CostExceeded {
            expression,
            reason: got,
        }) => {
            assert_eq!(expression, src);
            assert!(got.contains(reason), "{got}");
        }
        other => panic!("{src}: expected the cost budget to stop it, got {other:?}"),
    }
}

#[test]
fn three_nested_comprehensions_over_request_lists_are_refused_naming_the_expression() {
    let src = "object.spec.containers.all(a, object.spec.containers.all(b, \
               object.spec.containers.all(c, a.name != b.name || b.name != c.name)))";
    let err = too_costly(src).to_string();
    assert!(err.contains(src), "{err}");
    assert!(err.contains("too costly"), "{err}");
}

#[test]
fn a_cross_product_of_request_lists_is_refused() {
    too_costly("object.spec.containers.all(c, object.spec.volumes.exists(v, v.name == c.name))");
    too_costly("object.items.map(x, object.items.filter(y, y == x)).size() > 0");
}

#[test]
fn three_nested_passes_over_lists_built_in_the_expression_are_stopped_at_run_time() {
    // Bounded lists pass the static limit; the run-time limit stops the 64 million iterations.
    let src =
        "lists.range(400).all(a, lists.range(400).all(b, lists.range(400).all(c, a + b + c >= 0)))";
    assert_cost_exceeded(evaluate_on(src, &json!({})), src, "per evaluation");
}

#[test]
fn one_pass_and_passes_over_nested_lists_are_accepted() {
    for src in [
        "object.spec.containers.all(c, c.image.startsWith('ghcr.io/'))",
        "object.spec.containers.all(c, c.ports.all(p, p.containerPort > 1024))",
        "object.spec.containers.all(c, c.env.all(e, e.name.matches('^[A-Z_]+$')))",
        "images.containers.map(i, verifyImageSignatures(i, [attestors.notary])).all(n, n > 0)",
        "object.spec.containers.all(c, c.name.contains(object.metadata.name))",
        "object.spec.containers.map(c, c.image.split('/')).all(p, p.size() > 0)",
        "lists.range(1000).all(i, i >= 0)",
    ] {
        let p = accepted(src);
        assert!(p.estimated_cost() <= crate::STATIC_COST_LIMIT);
    }
}

#[test]
fn a_binding_inside_a_pass_reads_the_visited_element_once() {
    // `cel.bind` is a comprehension over `[]`: its body runs once per element, not once per
    // element of another list, so it costs what the same body would without the binding.
    let plain = accepted("object.items.filter(x, x.name == 'a' ? true : x.name == 'b')");
    let bound =
        accepted("object.items.filter(x, cel.bind(y, x.name == 'a', y ? y : x.name == 'b'))");
    assert!(bound.estimated_cost() < 2 * plain.estimated_cost());
    // A pass nested in the binding's body still multiplies.
    too_costly("object.items.all(x, cel.bind(y, x, object.items.exists(z, z == y)))");
}

/// An attestation statement (or a cluster object) is fetched data, not request data: passes
/// over its lists, however many and however deep, count as passes over a value the policy
/// defines, so checking an SBOM's components for every image is one pass over request data.
#[test]
fn passes_over_fetched_data_for_each_image_are_one_pass_over_request_data() {
    let sbom = "images.containers.all(image, cel.bind(p, extractPayload(image, attestations.sbom).predicate, \
         (type(p.components) == list ? p.components.filter(c, c.name == 'x').map(c, c.version) : []).all(v, v != '1.9')))";
    let scan = "images.containers.all(image, extractPayload(image, attestations.scan).predicate.matches\
         .map(m, m.vulnerability.cvss).flatten().filter(c, c.metrics.score > 8.0).size() == 0)";
    for src in [sbom, scan] {
        accepted(src);
    }
    // The same shape over request data is a pass nested in another.
    too_costly(
        "images.containers.all(image, object.spec.containers.filter(c, c.name == 'x')\
         .map(c, c.image).all(v, v != image))",
    );
    // A fetched value combined with request data is request data.
    too_costly(
        "images.containers.all(image, (extractPayload(image, attestations.sbom).predicate.components \
         + object.spec.containers).all(c, c.name != 'x'))",
    );
}

#[test]
fn a_repeated_pass_over_the_visited_element_multiplies() {
    // Inside `p`'s pass, `c.ports` is no longer `c`'s share of the list: any one container
    // may hold every port.
    too_costly("object.spec.containers.all(c, c.ports.all(p, c.ports.all(q, p != q)))");
}

#[test]
fn the_runtime_limit_stops_a_statically_accepted_pass_over_a_large_list() {
    let src = "object.items.all(x, x >= 0 && x < 1000000000)";
    assert!(evaluate_on(src, &object_with_items(100)).is_ok());
    assert_cost_exceeded(
        evaluate_on(src, &object_with_items(300_000)),
        src,
        "cost limit of 1000000 per evaluation",
    );
}

#[test]
fn map_and_filter_are_charged_per_iteration() {
    for src in [
        "object.items.map(x, x + 1).size() > 0",
        "object.items.filter(x, x >= 0).size() > 0",
        "object.items.map(x, x >= 0, x).size() > 0",
        "object.items.exists_one(x, x == 7)",
        "object.items.exists(x, x < 0)",
    ] {
        assert!(evaluate_on(src, &object_with_items(10)).is_ok(), "{src}");
        assert_cost_exceeded(
            evaluate_on(src, &object_with_items(600_000)),
            src,
            "per evaluation",
        );
    }
}

#[test]
fn map_results_keep_their_values_when_instrumented() {
    let object = object_with_items(4);
    assert_eq!(
        evaluate_on("object.items.map(x, x * 2)", &object),
        Ok(Value::List(Arc::new(
            [0, 2, 4, 6].into_iter().map(Value::Int).collect()
        )))
    );
    assert_eq!(
        evaluate_on(
            "object.items.filter(x, x % 2 == 1).map(x, x > 0, string(x))",
            &object
        ),
        evaluate_on("['1', '3']", &object)
    );
    assert_eq!(
        evaluate_on("object.items.sortBy(x, -x)[0]", &object),
        Ok(Value::Int(3))
    );
}

#[test]
fn an_absorbing_operator_cannot_hide_an_exhausted_budget() {
    // `error || true` is `true` in CEL; the exhausted budget must still fail the evaluation.
    let src = "object.items.all(x, x >= 0) || true";
    assert_cost_exceeded(
        evaluate_on(src, &object_with_items(600_000)),
        src,
        "per evaluation",
    );
}

#[test]
fn string_work_is_charged_by_size() {
    let big = "a".repeat(1_000_000);
    let object = json!({"s": big, "items": [1, 2, 3]});
    // Each iteration scans a megabyte-sized string: a few iterations spend the limit.
    let src = "lists.range(1000).all(i, !object.s.contains('b'))";
    assert_cost_exceeded(evaluate_on(src, &object), src, "per evaluation");
    // replace is charged for its result before building it.
    let src = "object.s.replace('', object.s).size() > 0";
    assert_cost_exceeded(evaluate_on(src, &object), src, "per evaluation");
    assert_eq!(
        evaluate_on(
            "'abc'.replace('', '-') + 'aXbXc'.replace('X', '', 1)",
            &object
        ),
        Ok(Value::String(Arc::new("-a-b-c-abXc".into())))
    );
}

#[test]
fn a_shared_budget_is_spent_across_evaluations() {
    let object = object_with_items(100_000);
    let p = accepted("object.items.all(x, x >= 0)");
    let budget = Arc::new(CostBudget::new(1_500_000, None));
    let mut act = Activation::new(&NoHost);
    act.bind_json("object", &object);
    act.set_budget(Arc::clone(&budget));
    assert_eq!(p.evaluate(&act), Ok(Value::Bool(true)));
    assert!(budget.remaining() < 1_000_000, "{}", budget.remaining());
    let second = p.evaluate(&act);
    assert!(
        matches!(&second, Err(EvalError::CostExceeded { reason, .. }) if reason.contains("policy's cost budget")),
        "{second:?}"
    );
}

#[test]
fn an_evaluation_does_not_outlive_its_deadline() {
    let past = || {
        Arc::new(CostBudget::for_policy(Some(
            ivory_clock::now() - Duration::from_millis(1),
        )))
    };
    let object = object_with_items(10_000);
    let p = accepted("object.items.all(x, x >= 0)");
    let mut act = Activation::new(&NoHost);
    act.bind_json("object", &object);
    act.set_budget(past());
    let result = p.evaluate(&act);
    assert!(
        matches!(&result, Err(EvalError::CostExceeded { reason, .. }) if reason.contains("deadline")),
        "{result:?}"
    );
    // A cheap evaluation still finishes after the deadline: it reads answers prefetched until
    // the deadline, and turns a missed one into the failurePolicy's outcome.
    let small = object_with_items(3);
    let mut act = Activation::new(&NoHost);
    act.bind_json("object", &small);
    act.set_budget(past());
    assert!(p.evaluate(&act).is_ok(), "{:?}", p.evaluate(&act));
}

/// The deadline is read on tokio's clock ([`ivory_clock::now`]): with the clock paused, an
/// evaluation never reaches it however slow the machine, and passes it once the test advances
/// the clock, on the worker and on the large-stack thread of deep programs alike.
#[tokio::test(start_paused = true)]
async fn the_deadline_follows_a_paused_clock() {
    let object = object_with_items(10_000);
    let shallow = "object.items.all(x, x >= 0)";
    let deep = format!("{}{shallow}{}", "[".repeat(30), "]".repeat(30));
    for src in [shallow, deep.as_str()] {
        let p = accepted(src);
        let mut act = Activation::new(&NoHost);
        act.bind_json("object", &object);
        let deadline = ivory_clock::deadline_in(Duration::from_secs(1));
        act.set_budget(Arc::new(CostBudget::for_policy(Some(deadline))));
        let before = p.evaluate(&act);
        assert!(before.is_ok(), "{src}: {before:?}");

        tokio::time::advance(Duration::from_secs(1)).await;
        let after = p.evaluate(&act);
        assert!(
            matches!(&after, Err(EvalError::CostExceeded { reason, .. }) if reason.contains("deadline")),
            "{src}: {after:?}"
        );
    }
}

#[test]
fn deep_programs_are_metered_on_their_own_thread() {
    // Deep enough to run on the large-stack thread.
    let src = format!(
        "{}object.items.all(x, x >= 0){}",
        "[".repeat(30),
        "]".repeat(30)
    );
    let p = accepted(&src);
    let mut act = Activation::new(&NoHost);
    let object = object_with_items(600_000);
    act.bind_json("object", &object);
    assert!(matches!(
        p.evaluate(&act),
        Err(EvalError::CostExceeded { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn an_evaluation_outgrowing_its_inline_slice_is_finished_off_the_worker() {
    let object = Arc::new(object_with_items(50_000));
    let run = |src: &'static str| {
        let object = Arc::clone(&object);
        tokio::spawn(async move {
            let mut act = Activation::new(&NoHost);
            act.bind_json("object", &object);
            let budget = Arc::new(CostBudget::for_policy(None));
            act.set_budget(Arc::clone(&budget));
            let result = accepted(src).evaluate(&act);
            (
                result,
                crate::POLICY_BUDGET - budget.remaining(),
                ivory_clock::now(),
            )
        })
    };
    // Needs more than the slice, less than the limit: the same answer as inline.
    let (result, spent, _) = run("object.items.all(x, x >= 0)").await.unwrap();
    assert_eq!(result, Ok(Value::Bool(true)));
    assert!(spent > super::INLINE_SLICE, "{spent}");

    // With one worker, a task spawned while a costly evaluation runs still gets to run before
    // that evaluation ends: the evaluation left the worker.
    let costly = run(
        "lists.range(400).all(a, lists.range(400).all(b, lists.range(400).all(c, a + b + c >= 0)))",
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let cheap = tokio::spawn(async { ivory_clock::now() });
    let cheap_done = cheap.await.unwrap();
    let (result, _, costly_done) = costly.await.unwrap();
    assert!(
        matches!(result, Err(EvalError::CostExceeded { .. })),
        "{result:?}"
    );
    assert!(cheap_done < costly_done);
}

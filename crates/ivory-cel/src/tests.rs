use super::*;
use ivory_testkit::cases::Failures;
use serde_json::json;
use std::sync::{Arc, Mutex};

fn scope() -> Scope {
    Scope::new([
        "object",
        "oldObject",
        "request",
        "namespaceObject",
        "variables",
        "images",
        "attestors",
        "attestations",
        "ref",
    ])
    .policy_defined(["attestors", "attestations"])
}

fn eval(src: &str) -> Result<Value, EvalError> {
    let p = compile(src, &scope()).unwrap_or_else(|e| panic!("compile {src}: {e}"));
    let mut act = Activation::new(&NoHost);
    act.bind_json("object", &pod());
    p.evaluate(&act)
}

fn eval_bool(src: &str) -> bool {
    let p = compile(src, &scope()).unwrap_or_else(|e| panic!("compile {src}: {e}"));
    let mut act = Activation::new(&NoHost);
    act.bind_json("object", &pod());
    p.evaluate_bool(&act)
        .unwrap_or_else(|e| panic!("eval {src}: {e}"))
}

fn pod() -> serde_json::Value {
    json!({
        "metadata": {"name": "p", "labels": {"env": "prod"}},
        "spec": {"containers": [
            {"name": "a", "image": "ghcr.io/acme/app:1.0"},
            {"name": "b", "image": "nginx"}
        ]}
    })
}

/// In-memory host recording its calls.
#[derive(Default)]
struct FakeHost {
    calls: Mutex<Vec<String>>,
}

impl Host for FakeHost {
    fn verify_image_signatures(
        &self,
        image: &str,
        attestors: &[serde_json::Value],
    ) -> Result<i64, HostError> {
        self.calls.lock().unwrap().push(format!(
            "sig {image} {}",
            serde_json::Value::from(attestors.to_vec())
        ));
        if image.starts_with("ghcr.io/") {
            Ok(attestors.len() as i64)
        } else if image == "broken" {
            Err(HostError::Registry("registry unreachable".into()))
        } else {
            Ok(0)
        }
    }
    fn verify_attestation_signatures(
        &self,
        image: &str,
        attestation: &str,
        attestors: &[serde_json::Value],
    ) -> Result<i64, HostError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("att {image} {attestation} {}", attestors.len()));
        Ok(1)
    }
    fn extract_payload(
        &self,
        image: &str,
        attestation: &str,
    ) -> Result<serde_json::Value, HostError> {
        Ok(json!({"predicate": {"image": image, "type": attestation, "ok": true}}))
    }
    fn image_data(&self, image: &str) -> Result<serde_json::Value, HostError> {
        Ok(json!({"image": image, "config": {"architecture": "amd64"}}))
    }
}

fn ivpol_activation(host: &dyn Host) -> Activation<'_> {
    let mut act = Activation::new(host);
    act.bind_json("object", &pod());
    act.bind_json(
        "images",
        &json!({"containers": ["ghcr.io/acme/app:1.0", "ghcr.io/acme/side:2"], "initContainers": []}),
    );
    act.bind_json(
        "attestors",
        &json!({"cosign": {"name": "cosign", "cosign": {"key": {"data": "PEM"}}}, "notary": {"name": "notary"}}),
    );
    act.bind_json("attestations", &json!({"sbom": "sbom"}));
    act
}

#[test]
fn compiles_and_evaluates_basic_expressions() {
    assert!(eval_bool("1 + 2 == 3"));
    assert!(eval_bool("object.metadata.name == 'p'"));
    assert!(eval_bool("object.spec.containers.all(c, c.image != '')"));
    assert!(eval_bool(
        "object.spec.containers.exists_one(c, c.name == 'a')"
    ));
    assert!(eval_bool(
        "object.spec.containers.map(c, c.name) == ['a', 'b']"
    ));
    assert!(eval_bool(
        "object.spec.containers.filter(c, c.name == 'b').size() == 1"
    ));
}

#[test]
fn undeclared_reference_is_a_compile_error() {
    let err = compile("imagez.size() > 0", &scope()).unwrap_err();
    assert_eq!(err.to_string(), "undeclared reference 'imagez'");
    let err = compile("object.a == x", &scope()).unwrap_err();
    assert_eq!(err, CompileError::UndeclaredReference("x".into()));
    // comprehension variables are bound only inside their macro
    assert!(compile("object.spec.containers.all(c, c.name != '')", &scope()).is_ok());
    let err = compile(
        "object.spec.containers.all(c, true) && c.name == ''",
        &scope(),
    )
    .unwrap_err();
    assert_eq!(err, CompileError::UndeclaredReference("c".into()));
    // variables is only available when declared
    let err = compile("variables.a", &Scope::new(["object"])).unwrap_err();
    assert_eq!(err, CompileError::UndeclaredReference("variables".into()));
}

#[test]
fn unknown_function_is_a_compile_error() {
    let err = compile("verifyImageSignaturez('a', [])", &scope()).unwrap_err();
    assert_eq!(
        err,
        CompileError::UnknownFunction("verifyImageSignaturez".into())
    );
    let err = compile("'a'.startsWit('a')", &scope()).unwrap_err();
    assert_eq!(err, CompileError::UnknownFunction("startsWit".into()));
    let err = compile("sets.containz([1], [1])", &scope()).unwrap_err();
    assert_eq!(err, CompileError::UnknownFunction("containz".into()));
}

#[test]
fn library_functions_are_known_to_the_checker() {
    for src in [
        "'a'.startsWith('a') && 'abc'.contains('b') && size('a') == 1",
        "'Abc'.lowerAscii() == 'abc' && 'a,b'.split(',') == ['a', 'b']",
        "[3, 1, 2].sort() == [1, 2, 3] && [[1], [2]].flatten() == [1, 2]",
        "math.greatest(1, 5, 2) == 5 && math.least([3, 4]) == 3",
        "base64.encode(b'hi') == 'aGk=' && base64.decode('aGk=') == b'hi'",
        "sets.contains([1, 2, 3], [2]) && sets.equivalent([1, 2], [2, 1]) && sets.intersects([1], [1, 5])",
        "optional.of(1).hasValue() && !optional.none().hasValue()",
        "string(1) == '1' && int('2') == 2 && double(1) == 1.0",
        "type(1) == int && type('a') == string",
        "'abc'.matches('^a') && 'abc 123'.find('[0-9]+') == '123'",
    ] {
        let p = compile(src, &scope()).unwrap_or_else(|e| panic!("compile {src}: {e}"));
        let act = Activation::new(&NoHost);
        assert_eq!(p.evaluate_bool(&act), Ok(true), "{src}");
    }
}

#[test]
fn parse_errors_are_reported() {
    let err = compile("object.metadata.name ==", &scope()).unwrap_err();
    assert!(matches!(err, CompileError::Parse(_)), "{err:?}");
    assert!(!err.to_string().is_empty());
    assert!(matches!(compile("", &scope()), Err(CompileError::Parse(_))));
    assert!(matches!(
        compile("'unterminated", &scope()),
        Err(CompileError::Parse(_))
    ));
}

#[test]
fn optional_syntax() {
    assert!(eval_bool(
        "object.?metadata.?labels.?env.orValue('none') == 'prod'"
    ));
    assert!(eval_bool(
        "object.?metadata.?annotations.?x.orValue('none') == 'none'"
    ));
    assert!(eval_bool(
        "object.spec.?initContainers.orValue([]).size() == 0"
    ));
    assert!(eval_bool("!object.?spec.?nope.hasValue()"));
    assert!(eval_bool("{'a': 1}[?'a'].orValue(0) == 1"));
}

#[test]
fn kyverno_example_expressions() {
    let host = FakeHost::default();
    let act = ivpol_activation(&host);
    for src in [
        "images.containers.map(image, verifyImageSignatures(image, [attestors.cosign])).all(e, e > 0)",
        "(images.containers + images.?ephemeralContainers.orValue([])).map(image, verifyImageSignatures(image, [attestors.cosign, attestors.notary])).all(e, e == 2)",
        "has(object.metadata.labels) && 'env' in object.metadata.labels",
        "images.containers.map(image, verifyAttestationSignatures(image, attestations.sbom, [attestors.cosign])).all(e, e > 0)",
        "images.containers.all(image, extractPayload(image, attestations.sbom).predicate.ok)",
        "images.containers.all(img, image.GetMetadata(img).config.architecture == 'amd64')",
        "images.containers.all(img, image.getMetadata(img).config.architecture == 'amd64')",
        "getImageData('ghcr.io/x/y:1').image == 'ghcr.io/x/y:1'",
    ] {
        let p = compile(src, &scope()).unwrap_or_else(|e| panic!("compile {src}: {e}"));
        assert_eq!(p.evaluate_bool(&act), Ok(true), "{src}");
    }
    let calls = host.calls.lock().unwrap();
    assert!(
        calls.contains(
            &r#"sig ghcr.io/acme/app:1.0 [{"cosign":{"key":{"data":"PEM"}},"name":"cosign"}]"#
                .to_owned()
        ),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"att ghcr.io/acme/side:2 sbom 1".to_owned()),
        "{calls:?}"
    );
}

#[test]
fn match_image_reference_expression() {
    let s = Scope::new(["ref"]);
    let p = compile("parseImageReference(ref).registry() == 'ghcr.io'", &s).unwrap();
    let mut act = Activation::new(&NoHost);
    act.bind_json("ref", &json!("ghcr.io/kyverno/test:signed"));
    assert_eq!(p.evaluate_bool(&act), Ok(true));
    act.bind_json("ref", &json!("nginx"));
    assert_eq!(p.evaluate_bool(&act), Ok(false));
    act.bind_json("ref", &json!("Bad Ref"));
    assert!(
        p.evaluate_bool(&act)
            .unwrap_err()
            .to_string()
            .contains("Bad Ref")
    );
}

#[test]
fn host_errors_and_wrong_arguments_are_runtime_errors() {
    let host = FakeHost::default();
    let act = ivpol_activation(&host);
    let p = compile(
        "verifyImageSignatures('broken', [attestors.cosign]) > 0",
        &scope(),
    )
    .unwrap();
    let err = p.evaluate(&act).unwrap_err().to_string();
    assert!(err.contains("registry unreachable"), "{err}");
    let p = compile(
        "verifyImageSignatures('ghcr.io/a/b', 'notalist') > 0",
        &scope(),
    )
    .unwrap();
    let err = p.evaluate(&act).unwrap_err().to_string();
    assert!(err.contains("verifyImageSignatures"), "{err}");
    // NoHost refuses politely
    let p = compile("getImageData('x')", &scope()).unwrap();
    let err = p
        .evaluate(&Activation::new(&NoHost))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not available in this context"), "{err}");
}

/// A host that fails every call with one error.
struct FailingHost(HostError);

impl Host for FailingHost {
    fn verify_image_signatures(&self, _: &str, _: &[serde_json::Value]) -> Result<i64, HostError> {
        Err(self.0.clone())
    }
    fn verify_attestation_signatures(
        &self,
        _: &str,
        _: &str,
        _: &[serde_json::Value],
    ) -> Result<i64, HostError> {
        Err(self.0.clone())
    }
    fn extract_payload(&self, _: &str, _: &str) -> Result<serde_json::Value, HostError> {
        Err(self.0.clone())
    }
    fn image_data(&self, _: &str) -> Result<serde_json::Value, HostError> {
        Err(self.0.clone())
    }
}

#[test]
fn a_host_error_reaches_the_expression_in_its_own_words_whatever_its_class() {
    let text = "failed to get payload: intoto attestation payload cannot be fetch before verifying intoto attestation";
    for (error, words) in [
        (HostError::NotVerified(text.into()), text),
        (
            HostError::Registry("r.test/app:1: unreachable".into()),
            "r.test/app:1: unreachable",
        ),
        (
            HostError::BudgetExhausted("r.test/app:1: time budget of 5ms exhausted".into()),
            "r.test/app:1: time budget of 5ms exhausted",
        ),
        (
            HostError::InvalidArgument("attestation not found in policy: x".into()),
            "attestation not found in policy: x",
        ),
        (HostError::NotAvailable, "not available in this context"),
    ] {
        let host = FailingHost(error);
        let act = ivpol_activation(&host);
        for (src, function) in [
            (
                "verifyImageSignatures('a', [attestors.cosign]) > 0",
                "verifyImageSignatures",
            ),
            ("extractPayload('a', 'sbom') != null", "extractPayload"),
        ] {
            let p = compile(src, &scope()).unwrap();
            assert_eq!(
                p.evaluate(&act),
                Err(EvalError::Runtime(format!(
                    "Error executing function '{function}': {words}"
                ))),
                "{src}"
            );
        }
    }
}

#[test]
fn image_comprehension_variable_shadows_the_library_object() {
    let act = ivpol_activation(&NoHost);
    let p = compile(
        "images.containers.map(image, parseImageReference(image).registry()) == ['ghcr.io', 'ghcr.io']",
        &scope(),
    )
    .unwrap();
    assert_eq!(p.evaluate_bool(&act), Ok(true));
    let p = compile(
        "images.containers.all(image, image.startsWith('ghcr.io/'))",
        &scope(),
    )
    .unwrap();
    assert_eq!(p.evaluate_bool(&act), Ok(true));
}

#[test]
fn variable_refs_are_detected() {
    let p = compile(
        "variables.a + variables['b'] + variables.?c.orValue('') + (has(variables.d) ? 'x' : '') + variables.a",
        &scope(),
    )
    .unwrap();
    assert_eq!(p.variable_refs(), ["a", "b", "c", "d"]);
    assert!(!p.uses_variables_dynamically());
    let p = compile("variables.cm.data.key == 'x'", &scope()).unwrap();
    assert_eq!(p.variable_refs(), ["cm"]);
    let p = compile("variables[object.metadata.name] == 1", &scope()).unwrap();
    assert!(p.uses_variables_dynamically());
    // a comprehension variable named `variables` is not the policy variables map
    let p = compile("[{'x': 1}].all(variables, variables.x == 1)", &scope()).unwrap();
    assert!(p.variable_refs().is_empty());
}

#[test]
fn globals_are_every_declared_variable_read_and_no_comprehension_variable() {
    let globals = |source: &str| -> Vec<String> {
        compile(source, &scope())
            .unwrap()
            .globals()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        globals("images.containers.all(i, i.startsWith('a')) && has(object.spec)"),
        ["images", "object"]
    );
    assert_eq!(globals("variables.a == 1"), ["variables"]);
    assert_eq!(
        globals("variables[request.name] == 1"),
        ["request", "variables"]
    );
    // `object` here is the comprehension's own variable.
    assert_eq!(globals("[1].all(object, object > 0)"), Vec::<String>::new());
    assert_eq!(globals("[1].all(x, x > 0) || object == null"), ["object"]);
}

#[test]
fn calls_function_reports_called_functions() {
    let p = compile(
        "images.containers.map(i, verifyImageSignatures(i, [attestors.cosign])).all(e, e > 0) && 'a'.matches('a') && image.GetMetadata('x') != null",
        &scope(),
    )
    .unwrap();
    assert!(p.calls_function("verifyImageSignatures"));
    assert!(p.calls_function("matches"));
    assert!(p.calls_function("image.GetMetadata"));
    assert!(!p.calls_function("verifyAttestationSignatures"));
    assert!(!p.calls_function("extractPayload"));
}

#[test]
fn literal_arguments_are_recorded_per_function() {
    let p = compile(
        "image.GetMetadata('ghcr.io/a/base:1').config.os == 'linux' && getImageData('r.test/b:2') != null && getImageData(object.spec.image) != null && getImageData('r.test/b:2') != null",
        &scope(),
    )
    .unwrap();
    let args = |name: &str| p.literal_arguments(name).collect::<Vec<_>>();
    assert_eq!(args("image.GetMetadata"), ["ghcr.io/a/base:1"]);
    assert_eq!(args("getImageData"), ["r.test/b:2"]);
    // The comparison's literal is an operator's argument, not a function's.
    assert!(args("_==_").is_empty());
    assert!(args("verifyImageSignatures").is_empty());
}

#[test]
fn typed_evaluation_helpers() {
    let act = Activation::new(&NoHost);
    let p = compile("'a' + 'b'", &scope()).unwrap();
    assert_eq!(p.evaluate_string(&act), Ok("ab".into()));
    assert_eq!(
        p.evaluate_bool(&act),
        Err(EvalError::UnexpectedType {
            expected: "bool",
            got: "string".into()
        })
    );
    assert_eq!(
        p.evaluate_bool(&act).unwrap_err().to_string(),
        "expected bool, got string"
    );
    let p = compile("null", &scope()).unwrap();
    assert_eq!(p.evaluate_optional_string(&act), Ok(None));
    let p = compile("optional.none()", &scope()).unwrap();
    assert_eq!(p.evaluate_optional_string(&act), Ok(None));
    let p = compile("'x'", &scope()).unwrap();
    assert_eq!(p.evaluate_optional_string(&act), Ok(Some("x".into())));
    let p = compile("1", &scope()).unwrap();
    assert!(p.evaluate_optional_string(&act).is_err());
    let p = compile("{'a': [1, 'b', null, 1.5, true]}", &scope()).unwrap();
    assert_eq!(
        p.evaluate_json(&act),
        Ok(json!({"a": [1, "b", null, 1.5, true]}))
    );
    let p = compile("ip('10.0.0.1')", &scope()).unwrap();
    assert_eq!(p.evaluate_json(&act), Ok(json!("10.0.0.1")));
    assert_eq!(p.source(), "ip('10.0.0.1')");
}

#[test]
fn runtime_type_mismatch_is_a_clear_error() {
    let err = eval("object.metadata.name + 1").unwrap_err().to_string();
    assert!(!err.is_empty());
    let err = eval("object.metadata.missing == 'x'")
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing"), "{err}");
    let err = eval("quantity(1)").unwrap_err().to_string();
    assert!(err.contains("quantity") && err.contains("int"), "{err}");
}

#[test]
fn bindings_can_be_replaced_and_values_bound() {
    let p = compile("ref == 'b'", &scope()).unwrap();
    let mut act = Activation::new(&NoHost);
    act.bind_json("ref", &json!("a"));
    act.bind_value("ref", Value::String(std::sync::Arc::new("b".into())));
    assert!(act.is_bound("ref"));
    assert_eq!(p.evaluate_bool(&act), Ok(true));
    let unbound = compile("object.x", &scope()).unwrap();
    assert!(
        unbound
            .evaluate(&act)
            .unwrap_err()
            .to_string()
            .contains("object")
    );
}

#[test]
fn program_is_send_sync_and_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Program>();
    let p = compile("object.metadata.labels.env == 'prod'", &scope()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            let p = p.clone();
            s.spawn(move || {
                let mut act = Activation::new(&NoHost);
                act.bind_json("object", &pod());
                assert_eq!(p.evaluate_bool(&act), Ok(true));
            });
        }
    });
}

#[test]
fn adversarial_inputs_error_instead_of_panicking() {
    // deep nesting
    let deep = format!("{}1{}", "(".repeat(5000), ")".repeat(5000));
    assert!(compile(&deep, &scope()).is_err());
    let deep_list = format!("{}1{}", "[".repeat(500), "]".repeat(500));
    assert!(compile(&deep_list, &scope()).is_err());
    let chain = format!("object{}", ".a".repeat(2000));
    assert!(compile(&chain, &scope()).is_err() || eval(&chain).is_err());
    // huge ints and overflow
    assert!(compile("99999999999999999999999999 > 1", &scope()).is_err());
    assert!(eval("9223372036854775807 + 1 > 0").is_err());
    assert!(eval("-9223372036854775808 / -1 > 0").is_err());
    assert!(eval("1 / 0 == 1").is_err());
    // bad regexes
    assert!(eval("'a'.matches('(')").is_err());
    assert!(eval("'a'.find('[')").is_err());
    assert!(eval("'a'.matches('a{100000}{100000}')").is_err());
    // too long
    let long = "1 + ".repeat(MAX_SOURCE_LEN / 4 + 1) + "1";
    assert!(matches!(
        compile(&long, &scope()),
        Err(CompileError::TooLong { .. })
    ));
    // odd but valid things
    assert!(eval("[].all(x, x > 0)").is_ok());
    assert!(eval("'\\u0000'.size() == 1").is_ok());
    assert!(eval("quantity('1e99999')").is_err());
    assert!(eval("semver('99999999999999999999999.0.0')").is_err());
}

#[test]
fn the_deepest_accepted_expression_evaluates_on_a_small_stack() {
    // A flat chain of additions just under the depth limit (each `+` is one level).
    let n = MAX_AST_DEPTH - 2;
    let src = format!("{}1", "1 + ".repeat(n));
    let p = compile(&src, &scope()).unwrap();
    let handle = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || p.evaluate(&Activation::new(&NoHost)))
        .unwrap();
    assert_eq!(handle.join().unwrap(), Ok(Value::Int(n as i64 + 1)));
    let too_deep = format!("{}1", "1 + ".repeat(MAX_AST_DEPTH + 5));
    assert_eq!(
        compile(&too_deep, &scope()).unwrap_err(),
        CompileError::TooDeep(MAX_AST_DEPTH)
    );
}

#[test]
fn inline_evaluation_fits_a_small_stack() {
    // Deepest program still evaluated on the caller's stack.
    let n = 22;
    let src = format!("{}1", "1 + ".repeat(n));
    let p = compile(&src, &scope()).unwrap();
    assert!(p.inner.depth <= 24, "{}", p.inner.depth);
    let handle = std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(move || p.evaluate(&Activation::new(&NoHost)))
        .unwrap();
    assert_eq!(handle.join().unwrap(), Ok(Value::Int(n as i64 + 1)));
}

#[test]
fn namespaced_functions_win_over_declared_variables() {
    let s = Scope::new(["image", "sets"]);
    let p = compile(
        "sets.contains([1], [1]) && image.GetMetadata('x') != null",
        &s,
    )
    .unwrap();
    assert!(p.calls_function("image.GetMetadata"));
}

/// Every library function [`library_functions_never_panic_on_wrong_arguments`] calls.
const LIBRARY_FUNCTIONS: &[&str] = &[
    "matches",
    "find",
    "findAll",
    "ip",
    "isIP",
    "ip.isCanonical",
    "family",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "cidr",
    "isCIDR",
    "containsIP",
    "containsCIDR",
    "masked",
    "prefixLength",
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
    "quantity",
    "isQuantity",
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "sign",
    "add",
    "sub",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
    "semver",
    "isSemver",
    "major",
    "minor",
    "patch",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "parseImageReference",
    "image",
    "isImage",
    "registry",
    "repository",
    "identifier",
    "tag",
    "digest",
    "containsDigest",
    "verifyImageSignatures",
    "verifyAttestationSignatures",
    "extractPayload",
    "getImageData",
    "image.GetMetadata",
    "isSorted",
    "sum",
    "min",
    "max",
    "indexOf",
    "lastIndexOf",
    "jsonpatch.escapeKey",
    "string",
    "size",
    "int",
    "base64.decode",
    "math.greatest",
    "lists.range",
    "optional.of",
    "orValue",
    "charAt",
    "substring",
];

/// The arguments it calls them with: many types, edge values.
const ARGUMENT_VALUES: &[&str] = &[
    "1",
    "-9223372036854775808",
    "18446744073709551615u",
    "1.5",
    "'x'",
    "''",
    "b'\\xff'",
    "null",
    "true",
    "[]",
    "[1, 'a']",
    "{'a': 1}",
    "ip('::1')",
    "cidr('10.0.0.0/8')",
    "quantity('1Ei')",
    "semver('1.0.0')",
    "image('nginx')",
    "url('/p?q=1')",
    "optional.none()",
    "'1.2.3.4'",
    "'10.0.0.0/8'",
    "'(('",
    "-1",
];

/// Calls every library function with arguments of many types, as global and member calls:
/// errors are fine, panics are not.
#[test]
fn library_functions_never_panic_on_wrong_arguments() {
    let scope = Scope::new(["x"]);
    let host = FakeHost::default();
    let act = Activation::new(&host);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut failures = Failures::new();
    for _ in 0..3000 {
        let f = LIBRARY_FUNCTIONS[next(LIBRARY_FUNCTIONS.len())];
        let args: Vec<&str> = (0..next(4))
            .map(|_| ARGUMENT_VALUES[next(ARGUMENT_VALUES.len())])
            .collect();
        let src = if f.contains('.') || next(2) == 0 || args.is_empty() {
            format!("{f}({})", args.join(", "))
        } else {
            format!("{}.{f}({})", args[0], args[1..].join(", "))
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match compile(&src, &scope) {
                Ok(p) => {
                    let _ = p.evaluate(&act).and_then(|v| value_to_json(&v));
                }
                Err(CompileError::Internal(e)) => panic!("internal compiler error: {e}"),
                Err(_) => {}
            }
        }));
        failures.check(&src, result.is_ok(), || "panicked".to_owned());
    }
    failures.assert_none();
}

/// Random token soup: compile and evaluation return errors, never panic the caller.
#[test]
fn token_soup_never_panics() {
    const TOKENS: &[&str] = &[
        "1",
        "1u",
        "1.0",
        "'s'",
        "b'b'",
        "null",
        "true",
        "x",
        "object",
        "[",
        "]",
        "{",
        "}",
        "(",
        ")",
        ",",
        ":",
        ".",
        ".?",
        "[?",
        "?",
        "+",
        "-",
        "*",
        "/",
        "%",
        "==",
        "<",
        "&&",
        "||",
        "!",
        "in",
        "has",
        "map",
        "all",
        "exists_one",
        "filter",
        "cel.bind",
        "size",
        "e",
        "`a-b`",
        "optional.of",
        "orValue",
        "\\",
        "\"",
        "'",
        "é",
        "\u{0}",
        "0x",
        "1e",
        "9223372036854775808",
    ];
    let scope = Scope::new(["x", "object"]);
    let mut act = Activation::new(&NoHost);
    act.bind_json("x", &json!({"a": [1, 2], "s": "v"}));
    act.bind_json("object", &pod());
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut internal = Vec::new();
    for _ in 0..1500 {
        let src: Vec<&str> = (0..1 + next(12))
            .map(|_| TOKENS[next(TOKENS.len())])
            .collect();
        let src = src.join(if next(2) == 0 { " " } else { "" });
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match compile(&src, &scope) {
                Ok(p) => {
                    let _ = p.evaluate(&act);
                    None
                }
                Err(CompileError::Internal(e)) => Some(e),
                Err(_) => None,
            }
        }));
        match result {
            Ok(Some(e)) => internal.push(format!("{src}: {e}")),
            Ok(None) => {}
            Err(_) => panic!("panicked on {src}"),
        }
    }
    assert!(internal.is_empty(), "{internal:#?}");
}

#[test]
fn string_lists_and_converted_values_read_as_their_json_does() {
    let images: std::collections::BTreeMap<String, Vec<String>> = [
        (
            "containers".to_owned(),
            vec!["a:1".to_owned(), "b@sha256:00".to_owned()],
        ),
        ("initContainers".to_owned(), Vec::new()),
    ]
    .into_iter()
    .collect();
    let attestors = json!({"k": {"name": "k", "cosign": {"key": {"data": "PEM"}}}});
    let converted = Arc::new(ConvertedJson::new(&attestors));
    let mut direct = Activation::new(&NoHost);
    direct.bind_string_lists("images", &images);
    direct.bind_converted("attestors", converted);
    let mut via_json = Activation::new(&NoHost);
    via_json.bind_json("images", &serde_json::to_value(&images).unwrap_or_default());
    via_json.bind_json("attestors", &attestors);
    for src in [
        "images",
        "attestors",
        "images.containers.size() == 2 && images.initContainers.size() == 0",
        "images.containers.map(i, i + attestors.k.cosign.key.data)",
        "'containers' in images && !('ephemeralContainers' in images)",
    ] {
        let program = compile(src, &scope()).unwrap_or_else(|e| panic!("compile {src}: {e}"));
        let a = program.evaluate(&direct).map_err(|e| e.to_string());
        let b = program.evaluate(&via_json).map_err(|e| e.to_string());
        assert_eq!(a, b, "{src}");
        assert!(a.is_ok(), "{src}: {a:?}");
    }
}

//! CEL expressions as policies carry them: parsing and checking against the variables a
//! validation, a match condition or an image matcher may use.
#![no_main]

use std::sync::LazyLock;

use ivory_cel::{Scope, compile};
use libfuzzer_sys::fuzz_target;

static SCOPES: LazyLock<[Scope; 3]> = LazyLock::new(|| {
    [
        Scope::new([
            "object",
            "oldObject",
            "request",
            "namespaceObject",
            "images",
            "attestors",
            "attestations",
            "variables",
        ]),
        Scope::new(["object", "oldObject", "request", "namespaceObject"]),
        Scope::new(["ref"]),
    ]
});

fuzz_target!(|data: &[u8]| {
    let Some((&selector, source)) = data.split_first() else {
        return;
    };
    let Ok(source) = std::str::from_utf8(source) else {
        return;
    };
    let scope = &SCOPES[usize::from(selector) % SCOPES.len()];
    if let Ok(program) = compile(source, scope) {
        assert_eq!(program.source(), source);
        let _ = program.variable_refs();
        let _ = program.uses_variables_dynamically();
    }
});

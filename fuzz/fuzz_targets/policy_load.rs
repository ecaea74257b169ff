//! Policy documents (YAML or JSON, one or many) through loading, validation and compilation
//! (which compiles every CEL expression, glob and key of the policy).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let report = ivory_policy::load_str(text, "fuzz.yaml");
    for error in &report.errors {
        let _ = error.to_string();
    }
    for policy in &report.policies {
        assert!(!policy.name.is_empty(), "a policy without a name compiled");
    }
});

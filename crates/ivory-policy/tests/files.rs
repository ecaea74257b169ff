use std::path::{Path, PathBuf};

use ivory_policy::load_path;

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

#[test]
fn kyverno_examples_load_unchanged() {
    let report = load_path(data("kyverno"));
    let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(report.policies.len(), 11);
}

//! The worst-case cost model of `JsonLimits` checked against the allocator: documents at the
//! limits, in the shapes that cost most per byte, never make `parse_json_bounded`
//! hold more than `worst_case_tree_bytes()` plus the document's own length. A separate test
//! binary, because it installs a counting global allocator.

#![allow(clippy::unwrap_used)]

use ivory_registry::{JsonLimits, json_shape, parse_json_bounded};
use serde_json::Value;

/// Builds the `i`-th array item of a shape.
type ItemFn = Box<dyn Fn(usize) -> String>;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Bytes the tree of `doc` holds once parsed.
fn tree_bytes(doc: &[u8], limits: &JsonLimits) -> usize {
    let before = dhat::HeapStats::get().curr_bytes;
    let tree: Value = parse_json_bounded(doc, limits).unwrap();
    let held = dhat::HeapStats::get().curr_bytes - before;
    drop(tree);
    held
}

/// `[item,item,…]` with as many items as `limits` allow.
fn filled(limits: &JsonLimits, item: impl Fn(usize) -> String) -> Vec<u8> {
    let one = json_shape(format!("[{}]", item(0)).as_bytes());
    let two = json_shape(format!("[{},{}]", item(0), item(1)).as_bytes());
    let (dv, dobj) = (two.values - one.values, two.objects - one.objects);
    let by_values = (limits.max_values - one.values) / dv;
    let by_objects = (limits.max_objects - one.objects)
        .checked_div(dobj)
        .unwrap_or(usize::MAX);
    let n = 1 + by_values.min(by_objects);
    let items: Vec<String> = (0..n).map(item).collect();
    let doc = format!("[{}]", items.join(","));
    assert!(json_shape(doc.as_bytes()).fits(limits));
    doc.into_bytes()
}

#[test]
fn trees_at_the_limits_stay_within_the_cost_model() {
    let _profiler = dhat::Profiler::builder().testing().build();
    for limits in [JsonLimits::MANIFEST, JsonLimits::SIGNATURE] {
        let shapes: [(&str, ItemFn); 7] = [
            ("one-entry objects", Box::new(|_| r#"{"":0}"#.into())),
            (
                "short-key objects",
                Box::new(|i| format!(r#"{{"{i}":"{i}"}}"#)),
            ),
            ("numbers", Box::new(|_| "0".into())),
            ("short strings", Box::new(|_| r#""a""#.into())),
            ("one-item arrays", Box::new(|_| "[0]".into())),
            ("empty containers", Box::new(|i| ["[]", "{}"][i % 2].into())),
            (
                "wide objects",
                Box::new(|i| format!(r#"{{"a{i}":1,"b{i}":"x","c{i}":[0],"d{i}":{{}}}}"#)),
            ),
        ];
        for (name, item) in shapes {
            let doc = filled(&limits, item);
            let held = tree_bytes(&doc, &limits);
            let bound = limits.worst_case_tree_bytes() + doc.len();
            println!(
                "{name}: {held} bytes held for a {}-byte document",
                doc.len()
            );
            assert!(
                held <= bound,
                "{name}: {held} bytes for a {}-byte document, bound {bound}",
                doc.len()
            );
        }
    }
}

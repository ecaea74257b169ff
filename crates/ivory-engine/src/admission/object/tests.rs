//! The summary is a shortcut, never a second opinion: wherever it exists, it reads what the
//! tree readers and the shape check read.

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::admission::AdmissionReview;
use crate::admission::shape::check_object;
use crate::images::{IMAGE_FIELDS, images_in_tree};

const POD_SPECS: [&str; 3] = [
    "/spec",
    "/spec/template/spec",
    "/spec/jobTemplate/spec/template/spec",
];
const SHAPE_PATHS: [&[&str]; 4] = [
    &[],
    &["spec"],
    &["spec", "template", "spec"],
    &["spec", "jobTemplate", "spec", "template", "spec"],
];

/// Every way the summary is read, compared with the tree readers.
fn assert_agrees(text: &str) -> bool {
    let tree: Value = match serde_json::from_str(text) {
        Ok(tree) => tree,
        Err(_) => return false,
    };
    let Ok(ObjectOnly(summary)) = serde_json::from_str::<ObjectOnly<ObjectSummary>>(text) else {
        return false;
    };
    for path in SHAPE_PATHS {
        assert_eq!(
            check_object("object", &tree, path),
            Ok(()),
            "{path:?} of {text}"
        );
    }
    assert_eq!(
        summary.labels(),
        &object_labels(Some(&tree)),
        "labels of {text}"
    );
    assert_eq!(
        summary.kind.as_deref(),
        tree.get("kind").and_then(Value::as_str),
        "kind of {text}"
    );
    let metadata = |field: &str| {
        tree.pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
    };
    let read = summary.metadata();
    assert_eq!(
        read.and_then(|m| m.name.as_deref()),
        metadata("name"),
        "name of {text}"
    );
    assert_eq!(
        read.and_then(|m| m.uid.as_deref()),
        metadata("uid"),
        "uid of {text}"
    );
    for pointer in POD_SPECS {
        for field in IMAGE_FIELDS {
            let from_summary = summary
                .pod_spec(pointer)
                .map(|spec| spec.images(field))
                .unwrap_or_default();
            assert_eq!(
                from_summary,
                images_in_tree(&tree, pointer, field),
                "{pointer} {field} of {text}"
            );
        }
    }
    true
}

/// A small deterministic generator of JSON text shaped like Kubernetes workloads, with wrong
/// types, nulls, lists for objects and duplicate keys mixed in.
struct Gen(u64);

const KEYS: [&str; 17] = [
    "kind",
    "metadata",
    "labels",
    "spec",
    "template",
    "jobTemplate",
    "containers",
    "initContainers",
    "ephemeralContainers",
    "volumes",
    "image",
    "reference",
    "name",
    "a",
    "nodeSelector",
    "app",
    "uid",
];
const STRINGS: [&str; 6] = [
    "Pod",
    "nginx",
    "ghcr.io/acme/app:1",
    "a\\\"b",
    "caf\\u00e9",
    "",
];

impl Gen {
    fn next(&mut self, bound: u64) -> u64 {
        // xorshift64*: enough spread for test inputs.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound
    }

    fn pick<'k>(&mut self, from: &[&'k str]) -> &'k str {
        from[self.next(from.len() as u64) as usize]
    }

    /// The keys a Kubernetes object has under `parent` (`""`: the top level).
    fn children(parent: &str) -> &'static [&'static str] {
        match parent {
            "" => &["kind", "metadata", "spec"],
            "metadata" => &["labels", "name", "uid"],
            "labels" | "nodeSelector" => &["app", "a"],
            "spec" => &[
                "containers",
                "initContainers",
                "ephemeralContainers",
                "volumes",
                "template",
                "jobTemplate",
            ],
            "template" | "jobTemplate" => &["spec", "metadata"],
            "container" => &["image", "name"],
            "volume" => &["image", "name"],
            "image" => &["reference"],
            _ => &KEYS,
        }
    }

    /// The usual type under `key` inside `parent`: 0 null, 2 string, 3 list, 5 object.
    fn usual(parent: &str, key: &str) -> u64 {
        match key {
            "containers" | "initContainers" | "ephemeralContainers" | "volumes" => 3,
            "image" if parent == "volume" => 5,
            "kind" | "image" | "reference" | "name" | "a" | "app" | "uid" => 2,
            _ => 5,
        }
    }

    fn value(&mut self, parent: &str, key: &str, depth: u32) -> String {
        // Mostly the type Kubernetes gives the key, sometimes any other.
        let pick = if self.next(20) != 0 {
            Self::usual(parent, key)
        } else {
            self.next(6)
        };
        match pick {
            _ if depth > 7 => "null".to_owned(),
            0 => "null".to_owned(),
            1 => self.pick(&["true", "1", "-2.5"]).to_owned(),
            2 => format!("\"{}\"", self.pick(&STRINGS)),
            3 | 4 => {
                let item = if key == "volumes" {
                    "volume"
                } else {
                    "container"
                };
                let items: Vec<String> = (0..self.next(4))
                    .map(|_| match self.next(8) {
                        0 => self.value("", "a", depth + 1),
                        _ => self.object(item, depth + 1),
                    })
                    .collect();
                format!("[{}]", items.join(","))
            }
            _ => self.object(key, depth + 1),
        }
    }

    fn object(&mut self, parent: &str, depth: u32) -> String {
        // The usual keys, each present or not; now and then any key, perhaps a duplicate.
        let mut keys: Vec<&str> = Self::children(parent)
            .iter()
            .copied()
            .filter(|_| self.next(4) != 0)
            .collect();
        if self.next(6) == 0 {
            keys.push(self.pick(&KEYS));
        }
        let fields: Vec<String> = keys
            .into_iter()
            .map(|key| format!("\"{key}\":{}", self.value(parent, key, depth)))
            .collect();
        format!("{{{}}}", fields.join(","))
    }
}

/// A review holding `object` and `old_object` (JSON texts), and its request alone.
fn review_with(object: &str, old_object: &str) -> (String, String) {
    let request = format!(
        r#"{{"uid":"u","kind":{{"kind":"Pod"}},"resource":{{"version":"v1","resource":"pods"}},"operation":"UPDATE","object":{object},"oldObject":{old_object}}}"#
    );
    let review = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
    );
    (review, request)
}

/// The review's one-pass parse reads what reading each object as raw JSON and summarizing it
/// afterwards reads: the same raw text, the same summary, the same tree. Returns whether the
/// object was summarized in place.
fn assert_one_pass_agrees(object: &str, old_object: &str) -> bool {
    let (review, request) = review_with(object, old_object);
    let Ok(parsed) = AdmissionReview::parse(review.as_bytes()) else {
        assert!(serde_json::from_str::<crate::admission::AdmissionRequest>(&request).is_err());
        return false;
    };
    let usual: crate::admission::AdmissionRequest = serde_json::from_str(&request).unwrap();
    let mut in_place = false;
    for (one_pass, usual) in [
        (&parsed.request.object, &usual.object),
        (&parsed.request.old_object, &usual.old_object),
    ] {
        assert_eq!(one_pass.is_some(), usual.is_some(), "{review}");
        let (Some(one_pass), Some(usual)) = (one_pass, usual) else {
            continue;
        };
        in_place |= one_pass.parts.raw.get().is_none();
        assert_eq!(
            format!("{:?}", one_pass.summary()),
            format!("{:?}", usual.summary()),
            "{review}"
        );
        assert_eq!(one_pass.raw(), usual.raw(), "{review}");
        assert_eq!(one_pass.value(), usual.value(), "{review}");
    }
    in_place
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn summary_agrees_with_the_tree(seed in 1u64..) {
        let mut generator = Gen(seed);
        let text = generator.object("", 0);
        assert_agrees(&text);
    }

    #[test]
    fn the_one_pass_review_parse_reads_what_two_passes_read(seed in 1u64..) {
        let mut generator = Gen(seed);
        let object = generator.object("", 0);
        let old_object = if seed % 3 == 0 { "null".to_owned() } else { generator.object("", 0) };
        assert_one_pass_agrees(&object, &old_object);
    }
}

#[test]
fn the_one_pass_parse_is_taken_for_usual_objects_only() {
    // The property above would hold vacuously if no review were read in one pass.
    let in_place = (1..500u64)
        .filter(|seed| {
            let mut generator = Gen(*seed);
            let object = generator.object("", 0);
            assert_one_pass_agrees(&object, "null")
        })
        .count();
    assert!(in_place > 50, "{in_place} of 500 reviews read in one pass");
    // A list where an object belongs: read the usual way, same raw text, no summary.
    let unusual = r#"{"metadata": [{"labels": {}}], "spec": {"containers": [{"image": "a"}]}}"#;
    assert!(!assert_one_pass_agrees(unusual, "null"));
    let (review, _) = review_with(unusual, "null");
    let parsed = AdmissionReview::parse(review.as_bytes()).unwrap();
    let object = parsed.request.object.unwrap();
    assert!(object.summary().is_none());
    assert_eq!(object.raw(), unusual);
    assert!(parsed.request.old_object.is_none());
}

#[test]
fn the_generator_reaches_summaries_with_images() {
    // The property above would hold vacuously if no generated object had a summary.
    let with_images = (1..2000u64)
        .map(|seed| Gen(seed).object("", 0))
        .filter(|text| assert_agrees(text))
        .filter(|text| {
            let summary: ObjectOnly<ObjectSummary> = serde_json::from_str(text).unwrap();
            POD_SPECS.iter().any(|p| {
                summary
                    .0
                    .pod_spec(p)
                    .is_some_and(|s| !s.images("containers").is_empty())
            })
        })
        .count();
    assert!(
        with_images > 20,
        "{with_images} of 2000 generated objects had images"
    );
}

fn fixture(name: &str) -> AdmissionReview {
    let path = format!(
        "{}/../../fixtures/admission/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    AdmissionReview::parse(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn every_fixture_object_has_a_summary_and_no_tree_until_one_is_read() {
    for entry in std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/admission"
    ))
    .unwrap()
    {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let review = fixture(&name);
        for object in [&review.request.object, &review.request.old_object]
            .into_iter()
            .flatten()
        {
            assert!(object.summary().is_some(), "{name}");
            assert!(assert_agrees(object.raw()), "{name}");
            assert!(!object.tree_built(), "{name}");
        }
    }
}

#[test]
fn unusual_objects_have_no_summary_and_are_read_from_the_tree() {
    for text in [
        // A list where an object belongs: serde would read it as the struct's fields in order.
        r#"{"metadata": [{"labels": {}}]}"#,
        r#"[null, null, {"containers": [{"image": "evil"}]}]"#,
        // The tree keeps the last of duplicate keys; the summary refuses them.
        r#"{"spec": {"containers": [{"image": "a"}]}, "spec": {"containers": [{"image": "b"}]}}"#,
        // Lenient tree readers skip a number label; the summary refuses it.
        r#"{"metadata": {"labels": {"a": 1}}}"#,
    ] {
        let object: AdmittedObject = serde_json::from_str(text).unwrap();
        assert!(object.summary().is_none(), "{text}");
    }
    let duplicate: AdmittedObject = serde_json::from_str(
        r#"{"kind": "Pod", "spec": {"containers": [{"image": "a"}]}, "spec": {"containers": [{"image": "b"}]}}"#,
    )
    .unwrap();
    assert_eq!(duplicate.kind(), Some("Pod"));
    assert_eq!(
        images_in_tree(duplicate.value(), "/spec", "containers"),
        vec![(0, "b")]
    );
}

#[test]
fn a_null_object_is_none_and_objects_round_trip_as_sent() {
    let review = fixture("pod-create.json");
    let object = review.request.object.as_ref().unwrap();
    let written = serde_json::to_string(object).unwrap();
    assert_eq!(written, object.raw());
    assert_eq!(&AdmittedObject::from(object.value().clone()), object);
    let req: crate::admission::AdmissionRequest = serde_json::from_str(
        r#"{"uid": "u", "kind": {"kind": "Pod"}, "resource": {"resource": "pods"}, "operation": "CREATE", "object": null}"#,
    )
    .unwrap();
    assert!(req.object.is_none());
}

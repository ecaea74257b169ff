//! Output formats of the one-shot commands.
//!
//! `--output json` is a stable interface: fields are only ever added. `verify` and `audit`
//! print `{"summary": {images, pass, fail, error, …}, "images": [ImageReport…]}` where each
//! image is `{"image", "digest", "verdict": "pass"|"fail"|"error", "policies": [{"policy",
//! "namespace", "result": "pass"|"fail"|"error"|"skip", "message", "attestors": [{"attestor",
//! "attestation", "result": "verified"|"failed"|"error"|"not-checked", "reason"}]}], "message"}`.
//! `yaml` is the same document as YAML.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::{Value, json};

use ivory_engine::report::{ImageReport, Verdict};

/// `--output` of `verify` and `apply`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
    Yaml,
}

/// `--output` of `audit` (adds SARIF).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AuditFormat {
    Table,
    Json,
    Yaml,
    Sarif,
}

/// Counts by verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub pass: usize,
    pub fail: usize,
    pub error: usize,
}

impl Counts {
    pub(crate) fn of(reports: &[ImageReport]) -> Self {
        let mut c = Self::default();
        for r in reports {
            match r.verdict {
                Verdict::Pass => c.pass += 1,
                Verdict::Fail => c.fail += 1,
                Verdict::Error => c.error += 1,
            }
        }
        c
    }

    pub(crate) fn total(&self) -> usize {
        self.pass + self.fail + self.error
    }
}

/// JSON or YAML text of `doc`.
pub(crate) fn render(doc: &Value, yaml: bool) -> anyhow::Result<String> {
    if yaml {
        Ok(ivory_policy::yaml::to_string(doc)?)
    } else {
        Ok(format!(
            "{}\n",
            json_for_terminal(serde_json::to_string_pretty(doc)?)
        ))
    }
}

/// JSON text with the control characters serde_json leaves raw (DEL, C1 controls, bidi
/// controls, line and paragraph separators) written as `\uXXXX` escapes: the same document
/// to a parser, and nothing that reorders or drives a terminal it is printed to. Outside
/// strings, JSON holds no such character (its pretty layout uses line feeds and spaces only).
pub(crate) fn json_for_terminal(json: String) -> String {
    if !json.chars().any(|c| c != '\n' && is_control(c)) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if c != '\n' && is_control(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `c` must not reach a terminal as is: C0 controls (CR, LF, ESC, …), DEL, C1
/// controls (U+0080–U+009F, 8-bit CSI), bidi embeddings, overrides and isolates (they
/// reorder what follows on the line: a "Trojan Source" display), and line/paragraph
/// separators.
fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `s` as it may be printed to a terminal: every control character (see `is_control`)
/// is written visibly, `\x1b` below U+0080 and `\u{202e}` above, so registry or user text
/// can neither move the cursor, recolour, retitle, reorder nor break a line: one record is
/// one line. Borrowed when there is nothing to escape.
pub(crate) fn terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !is_control(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// The image table: one row per image, then one indented row per policy and attestor.
/// Every text in it goes through [`terminal`].
pub(crate) fn image_table(reports: &[ImageReport]) -> String {
    image_table_explained(reports, false)
}

/// [`image_table`]; with `explain`, each attestor's reason is given alone and followed by one
/// row per signature layout read and what it held (`ivory verify --explain`).
pub(crate) fn image_table_explained(reports: &[ImageReport], explain: bool) -> String {
    let t = terminal;
    let mut out = String::new();
    for r in reports {
        let verdict = r.verdict.as_str().to_uppercase();
        if r.digest.is_none() && r.policies.is_empty() && r.message.starts_with(&r.image) {
            // Not checked at all: one line, the message names the image.
            out.push_str(&format!("{verdict:<5}  {}\n", t(&r.message)));
            continue;
        }
        out.push_str(&format!(
            "{verdict:<5}  {}  {}\n",
            t(&r.image),
            t(r.digest.as_deref().unwrap_or("-")),
        ));
        if r.policies.is_empty() && !r.message.is_empty() {
            out.push_str(&format!("       {}\n", t(&r.message)));
        }
        for p in &r.policies {
            let detail = if p.message.is_empty() {
                String::new()
            } else {
                format!(": {}", t(&p.message))
            };
            out.push_str(&format!(
                "       policy {} {}{detail}\n",
                t(&p.policy),
                p.result.as_str()
            ));
            for a in &p.attestors {
                let what = match &a.attestation {
                    Some(att) => format!("attestation {}", t(att)),
                    None => "signature".to_owned(),
                };
                let text = if explain { &a.brief } else { &a.reason };
                let reason = if text.is_empty() {
                    String::new()
                } else {
                    format!(": {}", t(text))
                };
                out.push_str(&format!(
                    "         attestor {} ({what}) {}{reason}\n",
                    t(&a.attestor),
                    a.result.as_str()
                ));
                for layout in a.looked.iter().filter(|_| explain) {
                    out.push_str(&format!("           looked at {}\n", t(layout)));
                }
            }
        }
        if !r.policies.is_empty()
            && r.verdict != Verdict::Pass
            && r.policies.iter().all(|p| p.message.is_empty())
        {
            out.push_str(&format!("       {}\n", t(&r.message)));
        }
    }
    out
}

/// The stable `--output json` form of one image's report: `{image, digest, verdict,
/// policies, message}` (plus `namespace` for a cluster Pod's image).
pub(crate) fn image_json(report: &ImageReport) -> Value {
    let policies: Vec<Value> = report
        .policies
        .iter()
        .map(|p| {
            let attestors: Vec<Value> = p
                .attestors
                .iter()
                .map(|a| {
                    json!({
                        "attestor": a.attestor,
                        "attestation": a.attestation,
                        "result": a.result.as_str(),
                        "reason": a.reason,
                        "looked": a.looked,
                    })
                })
                .collect();
            json!({
                "policy": p.policy,
                "namespace": p.namespace,
                "result": p.result.as_str(),
                "message": p.message,
                "attestors": attestors,
            })
        })
        .collect();
    let mut doc = json!({
        "image": report.image,
        "digest": report.digest,
        "verdict": report.verdict.as_str(),
        "policies": policies,
        "message": report.message,
    });
    if let Some(ns) = &report.namespace {
        doc["namespace"] = json!(ns);
    }
    doc
}

/// A SARIF 2.1.0 log with one result per failed or errored (image, policy).
pub(crate) fn sarif(reports: &[ImageReport]) -> Value {
    let mut rules = BTreeSet::new();
    let mut results = Vec::new();
    for r in reports.iter().filter(|r| r.verdict != Verdict::Pass) {
        let location = json!([{
            "logicalLocations": [{"name": r.image, "fullyQualifiedName": r.image, "kind": "resource"}]
        }]);
        // A failed policy and an unverifiable image both block deployment.
        let level = "error";
        let failing: Vec<_> = r
            .policies
            .iter()
            .filter(|p| p.result.is_problem())
            .collect();
        if failing.is_empty() {
            rules.insert("ivory".to_owned());
            results.push(json!({
                "ruleId": "ivory",
                "level": level,
                "message": {"text": format!("{}: {}", r.image, r.message)},
                "locations": location,
                "properties": {"digest": r.digest, "verdict": r.verdict.as_str()},
            }));
        }
        for p in failing {
            rules.insert(p.policy.clone());
            results.push(json!({
                "ruleId": p.policy,
                "level": level,
                "message": {"text": format!("{}: policy {} {}: {}", r.image, p.policy, p.result.as_str(), p.message)},
                "locations": location,
                "properties": {"digest": r.digest, "verdict": r.verdict.as_str()},
            }));
        }
    }
    let rules: Vec<Value> = rules
        .into_iter()
        .map(|id| json!({"id": id, "shortDescription": {"text": format!("ImageValidatingPolicy {id}")}}))
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "ivory",
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": "https://kyverno.io/docs/policy-types/image-validating-policy/",
                "rules": rules,
            }},
            "results": results,
        }],
    })
}

/// A `wgpolicyk8s.io/v1alpha2` ClusterPolicyReport: one result per (image, policy), the image
/// and digest in `properties` (registry images are not Kubernetes resources).
pub(crate) fn cluster_policy_report(reports: &[ImageReport], name: &str, now: (u64, u32)) -> Value {
    let mut summary = json!({"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0});
    let mut results = Vec::new();
    let mut add = |policy: &str, result: &str, message: &str, r: &ImageReport| {
        if let Some(n) = summary.get(result).and_then(Value::as_u64) {
            summary[result] = json!(n + 1);
        }
        results.push(json!({
            "source": "ivory",
            "policy": policy,
            "result": result,
            "message": message,
            "scored": true,
            "timestamp": {"seconds": now.0, "nanos": now.1},
            "properties": {
                "image": r.image,
                "digest": r.digest.clone().unwrap_or_default(),
            },
        }));
    };
    for r in reports {
        if r.policies.is_empty() {
            add("ivory", r.verdict.as_str(), &r.message, r);
        }
        for p in &r.policies {
            add(&p.policy, p.result.as_str(), &p.message, r);
        }
    }
    json!({
        "apiVersion": "wgpolicyk8s.io/v1alpha2",
        "kind": "ClusterPolicyReport",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "ivory"}},
        "summary": summary,
        "results": results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_engine::decision::Status;
    use ivory_engine::report::{AttestorOutcome, AttestorResult, PolicyOutcome};

    fn report(image: &str, verdict: Verdict, result: Status) -> ImageReport {
        ImageReport {
            namespace: None,
            image: image.into(),
            digest: Some("sha256:aa".into()),
            verdict,
            policies: vec![PolicyOutcome {
                policy: "signed".into(),
                namespace: None,
                result,
                message: if result == Status::Pass { "" } else { "bad" }.into(),
                attestors: Vec::new(),
            }],
            message: String::new(),
        }
    }

    #[test]
    fn terminal_text_shows_every_control_character() {
        assert!(matches!(terminal("r/a:v1 sha256:aa"), Cow::Borrowed(_)));
        assert_eq!(terminal("é ü 漢"), "é ü 漢");
        assert_eq!(
            terminal("a\x1b[2K\r\nPASS\t\x07\x7f\u{9b}31m"),
            "a\\x1b[2K\\x0d\\x0aPASS\\x09\\x07\\x7f\\u{9b}31m"
        );
        assert_eq!(
            terminal("\u{202e}gnp\u{2066}x\u{2069}\u{200f}\u{2028}\u{61c}"),
            "\\u{202e}gnp\\u{2066}x\\u{2069}\\u{200f}\\u{2028}\\u{61c}"
        );
        // Every code point: what comes out has no control left in it.
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let shown = terminal(&c.to_string()).into_owned();
            assert!(!shown.chars().any(is_control), "{:x}", c as u32);
        }
    }

    #[test]
    fn json_documents_escape_what_serde_json_leaves_raw() {
        let doc = json!({"name": "a\u{1b}]0;t\u{7}\u{7f}\u{9b}\u{202e}\u{2028}b", "n": 1});
        let text = render(&doc, false).unwrap();
        assert!(
            !text.chars().any(|c| c != '\n' && is_control(c)),
            "{text:?}"
        );
        assert!(
            text.contains(r#""a\u001b]0;t\u0007\u007f\u009b\u202e\u2028b""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), doc);
    }

    #[test]
    fn image_table_rows_are_one_line_each() {
        let mut r = report("r/a:v1\x1b[1A\rPASS  r/b", Verdict::Fail, Status::Fail);
        r.policies[0].policy = "p\u{202e}".into();
        r.policies[0].message = "bad\nPASS   r/c:1  sha256:00".into();
        r.policies[0].attestors.push(AttestorOutcome {
            attestor: "k\x1b]0;t\x07".into(),
            attestation: Some("sbom\r".into()),
            result: AttestorResult::Failed,
            reason: "nope\u{2066}".into(),
            brief: "nope\u{2066}".into(),
            looked: Vec::new(),
        });
        let error = ImageReport::error("x\ny", "x\ny: down\r\nPASS".into());
        let table = image_table(&[r, error]);
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(
            !table.chars().any(|c| c != '\n' && is_control(c)),
            "{table}"
        );
        assert!(table.contains("r/a:v1\\x1b[1A\\x0dPASS  r/b"), "{table}");
        assert!(
            table.contains("policy p\\u{202e} fail: bad\\x0aPASS"),
            "{table}"
        );
    }

    #[test]
    fn sarif_lists_failures_only() {
        let reports = [
            report("r/a:1", Verdict::Pass, Status::Pass),
            report("r/b:1", Verdict::Fail, Status::Fail),
        ];
        let doc = sarif(&reports);
        assert_eq!(doc["version"], "2.1.0");
        let results = doc["runs"][0]["results"].as_array().unwrap();
        assert_eq!(results.len(), 1);
        assert_eq!(results[0]["ruleId"], "signed");
        assert_eq!(
            results[0]["locations"][0]["logicalLocations"][0]["name"],
            "r/b:1"
        );
        assert_eq!(doc["runs"][0]["tool"]["driver"]["rules"][0]["id"], "signed");
    }

    #[test]
    fn policy_report_counts_results() {
        let reports = [
            report("r/a:1", Verdict::Pass, Status::Pass),
            report("r/b:1", Verdict::Fail, Status::Fail),
            ImageReport::error("r/c:1", "registry down".into()),
        ];
        let doc = cluster_policy_report(&reports, "ivory-audit", (1, 2));
        assert_eq!(
            doc["summary"],
            json!({"pass": 1, "fail": 1, "warn": 0, "error": 1, "skip": 0})
        );
        assert_eq!(doc["results"][2]["properties"]["image"], "r/c:1");
        assert_eq!(doc["results"][2]["message"], "registry down");
    }
}

//! What `ivory test` prints and writes: Kyverno's results table, `-o` documents (Kyverno's
//! keys; markdown) and JUnit XML. Every text a suite or the engine chose goes through
//! [`output::terminal`] (tables) or XML escaping.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::run::{Outcome, Row};
use crate::cmd::output;

/// `--output-format` documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum OutputFormat {
    Json,
    Yaml,
    Markdown,
    Junit,
}

/// `--output-format`: the rows as Kyverno's keys (ID, POLICY, RULE, RESOURCE, RESULT, REASON,
/// and Message with `--detailed-results`), or JUnit XML.
pub(super) fn document(
    format: OutputFormat,
    rows: &[Row],
    unrun: &[Unrun],
    detailed: bool,
) -> anyhow::Result<String> {
    if format == OutputFormat::Junit {
        return Ok(junit(rows, unrun, detailed));
    }
    if format == OutputFormat::Markdown {
        return Ok(markdown(rows, detailed));
    }
    let doc: Vec<serde_json::Value> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut row = serde_json::json!({
                "ID": i + 1,
                "POLICY": r.policy,
                "RULE": r.rule,
                "RESOURCE": r.resource,
                "RESULT": result_word(r),
                "REASON": r.reason,
            });
            if detailed {
                row["Message"] = r.message.clone().into();
            }
            row
        })
        .collect();
    output::render(&serde_json::Value::Array(doc), format == OutputFormat::Yaml)
}

/// Kyverno's markdown table; cells through [`output::terminal`], `|` escaped.
fn markdown(rows: &[Row], detailed: bool) -> String {
    let mut header = vec!["ID", "POLICY", "RULE", "RESOURCE", "RESULT", "REASON"];
    if detailed {
        header.push("MESSAGE");
    }
    let mut out = format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        "----|".repeat(header.len())
    );
    let cell = |text: &str| output::terminal(text).replace('|', "\\|");
    for (i, r) in rows.iter().enumerate() {
        let mut cells = vec![
            (i + 1).to_string(),
            cell(&r.policy),
            cell(&r.rule),
            cell(&r.resource),
            result_word(r).to_owned(),
            cell(&r.reason),
        ];
        if detailed {
            cells.push(cell(&r.message));
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

fn result_word(row: &Row) -> &'static str {
    match row.outcome {
        Outcome::Pass => "Pass",
        Outcome::Fail => "Fail",
        Outcome::NotRun => "Skip",
    }
}

/// Kyverno's result table: ID, POLICY, RULE, RESOURCE, RESULT, REASON (and MESSAGE), in
/// aligned columns; every cell goes through [`output::terminal`].
pub(super) fn table(rows: &[Row], detailed: bool, first_id: usize) -> String {
    let mut header = vec!["ID", "POLICY", "RULE", "RESOURCE", "RESULT", "REASON"];
    if detailed {
        header.push("MESSAGE");
    }
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for (i, r) in rows.iter().enumerate() {
        let mut cells = vec![
            (first_id + i).to_string(),
            r.policy.clone(),
            r.rule.clone(),
            r.resource.clone(),
            result_word(r).to_owned(),
            r.reason.clone(),
        ];
        if detailed {
            cells.push(r.message.clone());
        }
        lines.push(
            cells
                .iter()
                .map(|c| output::terminal(c).into_owned())
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let rule: Vec<String> = widths.iter().map(|w| "─".repeat(w + 2)).collect();
    let rule = format!("│{}│\n", rule.join("│"));
    let mut out = rule.clone();
    for (i, line) in lines.iter().enumerate() {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "│ {} │", cells.join(" │ "));
        if i == 0 {
            out.push_str(&rule);
        }
    }
    out.push_str(&rule);
    out
}

/// A test that could not be run, for the JUnit report.
pub(super) struct Unrun {
    pub(super) test: String,
    pub(super) message: String,
}

/// JUnit XML: one `testsuite` per test, one `testcase` per row (`classname` the policy,
/// `name` the resource and rule); a failed row has a `failure` whose message says what was
/// expected and what the engine concluded; a row not run is `skipped`; a test that could not
/// be run is one testcase with an `error`.
pub(super) fn junit(rows: &[Row], unrun: &[Unrun], detailed: bool) -> String {
    let mut suites: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        suites.entry(r.test.as_str()).or_default().push(r);
    }
    let failures = rows.iter().filter(|r| r.outcome == Outcome::Fail).count();
    let skipped = rows.iter().filter(|r| r.outcome == Outcome::NotRun).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"ivory test\" tests=\"{}\" failures=\"{failures}\" errors=\"{}\" skipped=\"{skipped}\">",
        rows.len() + unrun.len(),
        unrun.len()
    );
    for u in unrun {
        let _ = writeln!(
            out,
            "  <testsuite name=\"{0}\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\">\n    <testcase classname=\"kyverno-test\" name=\"{0}\"><error message=\"could not be run\">{1}</error></testcase>\n  </testsuite>",
            xml(&u.test),
            xml(&u.message)
        );
    }
    for (name, rows) in suites {
        let f = rows.iter().filter(|r| r.outcome == Outcome::Fail).count();
        let s = rows.iter().filter(|r| r.outcome == Outcome::NotRun).count();
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{f}\" skipped=\"{s}\">",
            xml(name),
            rows.len()
        );
        for r in rows {
            let _ = write!(
                out,
                "    <testcase classname=\"{}\" name=\"{}\">",
                xml(&r.policy),
                xml(&if r.rule.is_empty() {
                    r.resource.clone()
                } else {
                    format!("{} ({})", r.resource, r.rule)
                })
            );
            let detail = if detailed || r.outcome == Outcome::Fail {
                xml(&r.message)
            } else {
                String::new()
            };
            match r.outcome {
                Outcome::Pass => {
                    if !detail.is_empty() {
                        let _ = write!(out, "<system-out>{detail}</system-out>");
                    }
                }
                Outcome::Fail => {
                    let _ = write!(
                        out,
                        "<failure message=\"{}\">{detail}</failure>",
                        xml(&r.reason)
                    );
                }
                Outcome::NotRun => {
                    let _ = write!(out, "<skipped message=\"{}\"/>", xml(&r.reason));
                }
            }
            out.push_str("</testcase>\n");
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

/// Text as XML character data or attribute value: first as a terminal shows it (every
/// control character, C1 and bidi override written visibly, so a CI log printing the report
/// is not retitled or reordered and a record stays one line), then XML-escaped; characters
/// XML 1.0 cannot hold become U+FFFD.
fn xml(text: &str) -> String {
    let shown = output::terminal(text);
    let mut out = String::with_capacity(shown.len());
    for c in shown.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if xml_char(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
    out
}

/// XML 1.0's `Char` production (surrogates cannot be in a `str`).
fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{fffd}' | '\u{10000}'..)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_cells_stay_in_their_column() {
        let rows = vec![Row {
            test: "t".into(),
            policy: "p|q".into(),
            rule: String::new(),
            resource: "v1/Pod/default/a\n| forged |".into(),
            outcome: Outcome::Pass,
            reason: "Ok".into(),
            message: String::new(),
        }];
        let text = markdown(&rows, false);
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(
            text.contains("| 1 | p\\|q |  | v1/Pod/default/a\\x0a\\| forged \\| | Pass | Ok |"),
            "{text}"
        );
    }

    #[test]
    fn junit_escapes_and_says_expected_versus_got() {
        let rows = vec![Row {
            test: "t<1>".into(),
            policy: "p".into(),
            rule: "p".into(),
            resource: "v1/Pod/default/a".into(),
            outcome: Outcome::Fail,
            reason: "Want pass, got fail".into(),
            message: "image \"x\" & <y>\u{1b}".into(),
        }];
        let xml = junit(
            &rows,
            &[Unrun {
                test: "t2".into(),
                message: "bad".into(),
            }],
            false,
        );
        assert!(
            xml.contains("tests=\"2\" failures=\"1\" errors=\"1\"")
                && xml.contains("<error message=\"could not be run\">bad</error>"),
            "{xml}"
        );
        assert!(
            xml.contains("<testsuite name=\"t&lt;1&gt;\" tests=\"1\" failures=\"1\""),
            "{xml}"
        );
        assert!(xml.contains("<failure message=\"Want pass, got fail\">image &quot;x&quot; &amp; &lt;y&gt;\\x1b</failure>"), "{xml}");
    }

    #[test]
    fn junit_shows_controls_visibly_and_holds_only_xml_characters() {
        let rows = vec![Row {
            test: "t\u{1b}]0;title\u{7}".into(),
            policy: "p\u{9b}31m".into(),
            rule: "r\u{202e}".into(),
            resource: "v1/Pod/default/a\r\n\u{fffe}".into(),
            outcome: Outcome::Pass,
            reason: "Ok".into(),
            message: "m\u{2066}".into(),
        }];
        let xml = junit(&rows, &[], true);
        assert!(
            xml.contains("name=\"t\\x1b]0;title\\x07\"")
                && xml.contains("classname=\"p\\u{9b}31m\"")
                && xml.contains("name=\"v1/Pod/default/a\\x0d\\x0a\u{fffd} (r\\u{202e})\"")
                && xml.contains("<system-out>m\\u{2066}</system-out>"),
            "{xml}"
        );
        assert!(
            xml.chars()
                .all(|c| c == '\n' || (!c.is_control() && xml_char(c))),
            "{xml}"
        );
    }
}

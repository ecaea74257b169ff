//! The one multi-document YAML reader of the workspace: policy files, `ivory convert`'s legacy
//! files, `ivory apply`'s resources and `ivory test`'s suites are all cut into documents here.
//!
//! Hand-written (the rule in docs/ARCHITECTURE.md). It replaces serde-saphyr's own
//! multi-document deserializer (`from_multiple`, `read`), which the workspace already uses for
//! each document: that one stops at the first syntax error ("after a syntax error ... the
//! iterator ends", its `read` docs) and drops null documents without saying which, while ivory
//! reports every document's error by number and line and goes on with the others ("one bad
//! document never stops the others"). So the stream is cut at its marker lines (`---` or `...`
//! at column 0, alone or followed by a blank: YAML forbids such a line inside any content,
//! block scalars included) and each piece is parsed on its own. Oracle:
//! `tests::agrees_with_serde_saphyrs_multi_document_reader`, on a table of streams.

use serde_json::Value;

use super::SyntaxError;

/// One document of a YAML stream, parsed on its own.
#[derive(Debug)]
pub struct YamlDocument {
    /// 1-based position among the documents that hold anything but comments and directives.
    pub number: usize,
    /// Its value, or why it does not parse (located in the whole text).
    pub value: Result<Value, SyntaxError>,
}

/// The documents of a YAML stream, in order, each parsed on its own so a syntax error in one
/// does not hide the ones after it. Documents of only comments (or nothing) are left out;
/// a document that is `null` is kept (callers skip it).
pub fn yaml_documents(text: &str) -> Vec<YamlDocument> {
    let mut docs = Vec::new();
    for chunk in split(text) {
        if !chunk.has_content() {
            continue;
        }
        let number = docs.len() + 1;
        let value = crate::yaml::from_str::<Value>(&chunk.text)
            .map_err(|e| SyntaxError::yaml(&e, chunk.first_line));
        docs.push(YamlDocument { number, value });
    }
    docs
}

impl SyntaxError {
    /// The parser's error in a document whose first line is `first_line` of the whole text.
    fn yaml(err: &crate::yaml::Error, first_line: usize) -> Self {
        let offset = first_line.saturating_sub(1);
        let location = err.location();
        let whole = |n: u64| usize::try_from(n).ok().map(|n| n + offset);
        SyntaxError::Yaml {
            message: crate::yaml::describe(err, first_line),
            line: location.and_then(|l| whole(l.line())),
            column: location.and_then(|l| usize::try_from(l.column()).ok()),
        }
    }
}

struct Chunk {
    /// 1-based line number of the chunk's first line in the whole text.
    first_line: usize,
    text: String,
}

impl Chunk {
    fn has_content(&self) -> bool {
        self.text.lines().any(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#') && !t.starts_with('%')
        })
    }
}

/// Cuts `text` at its marker lines. Content after `---` on the marker line (`--- {a: 1}`,
/// `--- |`) stays, indented by three blanks so its columns still match.
fn split(text: &str) -> Vec<Chunk> {
    let mut chunks = vec![Chunk {
        first_line: 1,
        text: String::new(),
    }];
    for (i, line) in text.lines().enumerate() {
        let marker = ["---", "..."].into_iter().find(|m| {
            line.strip_prefix(m)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
        });
        if let Some(m) = marker {
            let mut chunk = Chunk {
                first_line: i + 1,
                text: String::new(),
            };
            if m == "---" {
                chunk.text.push_str("   ");
                chunk.text.push_str(&line[3..]);
            }
            chunk.text.push('\n');
            chunks.push(chunk);
            continue;
        }
        if let Some(chunk) = chunks.last_mut() {
            chunk.text.push_str(line);
            chunk.text.push('\n');
        }
    }
    chunks
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{YamlDocument, yaml_documents};
    use crate::SyntaxError;

    fn values(docs: Vec<YamlDocument>) -> Vec<Value> {
        docs.into_iter()
            .map(|d| d.value.unwrap())
            .filter(|v| !v.is_null())
            .collect()
    }

    /// The oracle: on every stream that parses, the documents are serde-saphyr's own
    /// multi-document reader's, with the same options (nulls aside, which both skip).
    #[test]
    fn agrees_with_serde_saphyrs_multi_document_reader() {
        let table = [
            "a: 1\n",
            "a: 1\n---\nb: 2\n",
            "---\na: 1\n---\nb: 2\n...\n",
            "--- # a comment\na: 1\n--- # another\nb: 2\n",
            "--- {a: 1}\n--- [1, 2]\n",
            "# only a comment\n---\n# and another\n---\na: 1\n",
            "a: |\n  line\n  --- not a marker, indented\nb: 2\n",
            "--- |\n  block at the top\n  ---x\n---\nc: 3\n",
            "a: 1\n...\n---\nb: 2\n",
            "a: '---'\nb: \"...\"\n",
            "a: 1\n---\n~\n---\nb: 2\n",
            "%YAML 1.2\n---\na: 1\n",
            "a: 1\n---\t\nb: 2\n",
            "",
            "---\n",
            "key: &x {a: 1}\n---\nother: 2\n",
        ];
        for text in table {
            let ours = values(yaml_documents(text));
            let theirs: Vec<Value> =
                serde_saphyr::from_multiple_with_options(text, crate::yaml::options())
                    .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let theirs: Vec<Value> = theirs.into_iter().filter(|v| !v.is_null()).collect();
            assert_eq!(ours, theirs, "{text:?}");
        }
    }

    /// Where the two part: a syntax error stops serde-saphyr's reader, not this one.
    #[test]
    fn a_bad_document_does_not_hide_the_next_and_is_located_in_the_whole_text() {
        let text = "a: 1\n---\nb: [\n---\nc: 3\n";
        assert!(
            serde_saphyr::from_multiple_with_options::<Value>(text, crate::yaml::options())
                .is_err()
        );
        let docs = yaml_documents(text);
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0].value.as_ref().unwrap(), &json!({"a": 1}));
        assert_eq!(docs[2].value.as_ref().unwrap(), &json!({"c": 3}));
        match &docs[1].value {
            Err(SyntaxError::Yaml { line, message, .. }) => {
                assert!(matches!(line, Some(3 | 4)), "{line:?} {message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(docs[1].number, 2);
    }
}

//! The failure matrix: what each end-to-end scenario sent, what the API server answered,
//! whether the object was stored, and its UID, written as a Markdown table.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One observed request.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// The scenario's name (`4 slow registry`).
    pub scenario: String,
    /// What was sent to the API server.
    pub request: String,
    /// What the API server answered.
    pub response: String,
    /// Whether the object was stored (`yes`, `no`, `n/a`).
    pub stored: String,
    /// The stored object's UID, if any.
    pub uid: String,
    /// How long the API server took to answer, in milliseconds.
    pub millis: Option<u128>,
}

/// Rows in the order they were recorded.
#[derive(Debug, Default)]
pub struct FailureMatrix {
    rows: Mutex<Vec<Row>>,
}

impl FailureMatrix {
    /// Appends `row`.
    pub fn record(&self, row: Row) {
        if let Ok(mut rows) = self.rows.lock() {
            rows.push(row);
        }
    }

    /// The table as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| # | Request | API response | Stored? | UID | Time (ms) |\n|---|---|---|---|---|---|\n",
        );
        let rows = self.rows.lock().map(|r| r.clone()).unwrap_or_default();
        for r in rows {
            let millis = r.millis.map(|m| m.to_string()).unwrap_or_default();
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                cell(&r.scenario),
                cell(&r.request),
                cell(&r.response),
                cell(&r.stored),
                cell(&r.uid),
                millis
            ));
        }
        out
    }

    /// Writes the table with a title to `path`, creating folders.
    pub fn write(&self, path: &Path, title: &str) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, format!("# {title}\n\n{}", self.markdown()))
    }
}

/// `target/e2e/<file>` of this workspace (or of `CARGO_TARGET_DIR`).
pub fn report_path(file: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("e2e").join(file)
}

/// Longest cell: room for a denial that names a digest-pinned image after the webhook's name.
const MAX_CELL: usize = 480;

/// Table cells: one line, no pipes, bounded length.
fn cell(text: &str) -> String {
    let flat = text.replace('|', "\\|").replace(['\n', '\r'], " ");
    if flat.chars().count() > MAX_CELL {
        let cut: String = flat.chars().take(MAX_CELL - 3).collect();
        format!("{cut}...")
    } else {
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_render_as_one_line_cells() {
        let matrix = FailureMatrix::default();
        matrix.record(Row {
            scenario: "1".into(),
            request: "create a|b".into(),
            response: "denied:\nno".into(),
            stored: "no".into(),
            uid: String::new(),
            millis: Some(12),
        });
        let text = matrix.markdown();
        let last = text.lines().last().unwrap();
        assert_eq!(last, "| 1 | create a\\|b | denied: no | no |  | 12 |");
        assert_eq!(cell(&"x".repeat(600)).len(), MAX_CELL);
        assert!(cell(&"x".repeat(600)).ends_with("..."));
        assert_eq!(cell(&"x".repeat(MAX_CELL)).len(), MAX_CELL);
    }
}

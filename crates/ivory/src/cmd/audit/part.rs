//! A shard's part of a sharded audit (`--shard I/N --shard-out DIR`), written as it goes so
//! that a shard killed and started again continues where it stopped, and read back by
//! `--merge` (`merge.rs`).
//!
//! * `DIR/shard-I-of-N.jsonl`: one finished image report per line, appended as each finishes
//!   (a `write` per line: a killed process loses at most the line it was writing, which is
//!   then cut off).
//! * `DIR/shard-I-of-N.done.json`: written, atomically, once the shard has gone through all
//!   its sources: what it found. A part without it is unfinished.
//!
//! Files on a volume the shards share (not PolicyReports or ConfigMaps): an audit of a large
//! registry outgrows the 1.5 MiB an API object may hold, and a line appended per image is
//! what lets a retried shard resume without counting an image twice.

use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use ivory_engine::report::{ImageReport, Verdict};
use serde::{Deserialize, Serialize};

use super::shard::Shard;

/// The longest line a part may hold (a report with every policy's and attestor's text).
const MAX_LINE_BYTES: u64 = 4 << 20;

/// What a finished shard found, in its `.done.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Completion {
    /// The shard, `I/N`.
    pub(crate) shard: String,
    /// Images and listing problems it found (its share of `summary.found`).
    pub(crate) found: usize,
    /// Whether a registry listing stopped at `--max-images`.
    pub(crate) truncated: bool,
    /// Reports in its part.
    pub(crate) reports: usize,
}

/// A shard's part, open for appending.
pub(crate) struct Part {
    file: File,
    path: PathBuf,
    done_path: PathBuf,
    /// The first write that failed: the part is then incomplete, and never marked done.
    failed: Option<std::io::Error>,
}

/// What `--shard-out` holds for a shard when it starts.
pub(crate) enum Opened {
    /// The shard finished before: nothing to do.
    Complete(Completion),
    /// The part to go on with, and the reports kept from an earlier run (pass and fail:
    /// errors are checked again).
    Resume {
        /// The part, open for appending.
        part: Part,
        /// The earlier run's pass and fail reports.
        kept: Vec<ImageReport>,
    },
}

/// The part's and the marker's paths for `shard` in `dir`.
pub(crate) fn paths(dir: &Path, shard: Shard) -> (PathBuf, PathBuf) {
    let stem = shard.file_stem();
    (
        dir.join(format!("{stem}.jsonl")),
        dir.join(format!("{stem}.done.json")),
    )
}

impl Part {
    /// Opens `shard`'s part in `dir` (created when missing): an earlier run's complete lines
    /// are read, its pass and fail reports kept and written back alone, and the rest checked
    /// again.
    pub(crate) fn open(dir: &Path, shard: Shard) -> anyhow::Result<Opened> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating --shard-out {}", dir.display()))?;
        let (path, done_path) = paths(dir, shard);
        if let Some(completion) = read_completion(&done_path)? {
            return Ok(Opened::Complete(completion));
        }
        let kept: Vec<ImageReport> = if path.exists() {
            read_reports(&path)?
                .into_iter()
                .filter(|r| r.verdict != Verdict::Error)
                .collect()
        } else {
            Vec::new()
        };
        let mut text = Vec::new();
        for report in &kept {
            text.extend(line(report)?);
        }
        super::super::files::write_replacing(&path, &text)?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let part = Part {
            file,
            path,
            done_path,
            failed: None,
        };
        Ok(Opened::Resume { part, kept })
    }

    /// Appends one finished report; a failure is kept for [`Part::complete`].
    pub(crate) fn append(&mut self, report: &ImageReport) {
        if self.failed.is_some() {
            return;
        }
        let written = line(report)
            .map_err(std::io::Error::other)
            .and_then(|bytes| self.file.write_all(&bytes));
        if let Err(e) = written {
            self.failed = Some(e);
        }
    }

    /// Marks the part done with `completion`, unless a line could not be written.
    pub(crate) fn complete(mut self, completion: &Completion) -> anyhow::Result<()> {
        if let Some(e) = self.failed.take() {
            bail!(
                "writing {}: {e}; the shard's part is incomplete and not marked done",
                self.path.display()
            );
        }
        self.file
            .sync_all()
            .with_context(|| format!("syncing {}", self.path.display()))?;
        let text = serde_json::to_vec_pretty(completion)?;
        super::super::files::write_replacing(&self.done_path, &text)
    }
}

fn line(report: &ImageReport) -> anyhow::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec(report)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The `.done.json` at `path`, if there is one.
pub(crate) fn read_completion(path: &Path) -> anyhow::Result<Option<Completion>> {
    if !path.exists() {
        return Ok(None);
    }
    let mut text = Vec::new();
    super::super::files::open_regular(path)?
        .take(MAX_LINE_BYTES)
        .read_to_end(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    let completion = serde_json::from_slice(&text)
        .with_context(|| format!("{}: not a shard's completion marker", path.display()))?;
    Ok(Some(completion))
}

/// Every complete line of a part: a last line without its newline (the write a kill cut
/// short) is left out; any other line that is not a report is an error naming it.
pub(crate) fn read_reports(path: &Path) -> anyhow::Result<Vec<ImageReport>> {
    let file = super::super::files::open_regular(path)?;
    let mut reader = BufReader::new(file);
    let mut reports = Vec::new();
    let mut number = 0;
    loop {
        let mut bytes = Vec::new();
        let read = (&mut reader)
            .take(MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut bytes)
            .with_context(|| format!("reading {}", path.display()))?;
        number += 1;
        if read == 0 || bytes.last() != Some(&b'\n') {
            if bytes.len() as u64 > MAX_LINE_BYTES {
                bail!(
                    "{}:{number}: a line longer than {MAX_LINE_BYTES} bytes",
                    path.display()
                );
            }
            return Ok(reports);
        }
        let report = serde_json::from_slice(&bytes)
            .with_context(|| format!("{}:{number}: not an image report", path.display()))?;
        reports.push(report);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(image: &str, verdict: Verdict) -> ImageReport {
        ImageReport {
            verdict,
            digest: Some(format!("sha256:{}", "a".repeat(64))),
            ..ImageReport::error(image, format!("{image}: said"))
        }
    }

    #[test]
    fn a_part_resumes_with_its_verdicts_and_drops_a_torn_line_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard { index: 1, count: 2 };
        let Opened::Resume { mut part, kept } = Part::open(dir.path(), shard).unwrap() else {
            panic!("a new part is not complete");
        };
        assert!(kept.is_empty());
        part.append(&report("r/a:1", Verdict::Pass));
        part.append(&report("r/b:1", Verdict::Error));
        part.append(&report("r/c:1", Verdict::Fail));
        drop(part);
        // A kill in the middle of a line.
        let (path, done) = paths(dir.path(), shard);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"image":"r/d:1","names"#).unwrap();

        let Opened::Resume { part, kept } = Part::open(dir.path(), shard).unwrap() else {
            panic!("an unfinished part is resumed");
        };
        let images: Vec<&str> = kept.iter().map(|r| r.image.as_str()).collect();
        assert_eq!(images, ["r/a:1", "r/c:1"], "errors are checked again");
        assert_eq!(read_reports(&path).unwrap().len(), 2, "written back alone");
        let completion = Completion {
            shard: shard.label(),
            found: 2,
            truncated: false,
            reports: 2,
        };
        part.complete(&completion).unwrap();
        assert!(done.exists());
        assert!(matches!(
            Part::open(dir.path(), shard).unwrap(),
            Opened::Complete(c) if c.reports == 2
        ));
    }

    #[test]
    fn a_line_that_is_not_a_report_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-0-of-1.jsonl");
        std::fs::write(&path, "{\"not\": \"a report\"}\n").unwrap();
        let error = format!("{:#}", read_reports(&path).unwrap_err());
        assert!(
            error.contains("shard-0-of-1.jsonl:1: not an image report"),
            "{error}"
        );
    }
}

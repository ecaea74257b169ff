//! `ivory audit --merge DIR`: the parts of a sharded audit joined into the one report the
//! single-process audit writes. Every shard `0..N` must have finished (its `.done.json`);
//! otherwise the merge names the shards that are missing or unfinished and writes nothing,
//! so a partial audit is never taken for a whole one.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use anyhow::{Context as _, bail};
use ivory_engine::report::{ImageReport, verification_key};

use super::Finished;
use super::part::{paths, read_completion, read_reports};
use super::shard::Shard;
use crate::cmd::output::Counts;

/// The shards' count, from the part and marker names in `dir` (`shard-I-of-N.*`).
fn shard_count(dir: &Path) -> anyhow::Result<u32> {
    let mut counts = BTreeSet::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("reading --merge {}", dir.display()))?;
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let count = name
            .strip_prefix("shard-")
            .and_then(|rest| rest.split_once("-of-"))
            .and_then(|(_, rest)| rest.split('.').next())
            .and_then(|n| n.parse::<u32>().ok());
        counts.extend(count);
    }
    match counts.len() {
        0 => bail!(
            "--merge {}: no shard parts there (shard-I-of-N.jsonl)",
            dir.display()
        ),
        1 => Ok(counts.into_iter().next().unwrap_or(0)),
        _ => bail!(
            "--merge {}: parts of audits split differently ({:?} shards): merge one audit's parts",
            dir.display(),
            counts
        ),
    }
}

/// Reads every shard's part and joins them; per shard, its label and counts (for stderr).
pub(super) fn merge(dir: &Path) -> anyhow::Result<(Finished, Vec<(String, Counts)>)> {
    let count = shard_count(dir)?;
    let mut problems = Vec::new();
    let mut finished = Finished::default();
    let mut per_shard = Vec::new();
    let mut seen = HashSet::new();
    for index in 0..count {
        let shard = Shard { index, count };
        let (part, done) = paths(dir, shard);
        let label = shard.label();
        let Some(completion) = read_completion(&done)? else {
            problems.push(if part.exists() {
                let so_far = read_reports(&part).map(|r| r.len()).unwrap_or(0);
                format!(
                    "shard {label}: unfinished ({so_far} images so far): its run failed or is \
                     still going; run it again to resume"
                )
            } else {
                format!("shard {label}: no part (never started, or it wrote elsewhere)")
            });
            continue;
        };
        let reports = read_reports(&part)?;
        if reports.len() != completion.reports {
            problems.push(format!(
                "shard {label}: its part holds {} reports, its marker says {}",
                reports.len(),
                completion.reports
            ));
        }
        for report in &reports {
            if !shard.owns(&report.image) {
                bail!(
                    "{}: {} belongs to another shard",
                    part.display(),
                    report.image
                );
            }
            if !seen.insert((report.image.clone(), report.namespace.clone())) {
                bail!("{}: {} is reported twice", part.display(), report.image);
            }
        }
        finished.found += completion.found;
        finished.truncated |= completion.truncated;
        per_shard.push((label, Counts::of(&reports)));
        finished.reports.extend(reports);
    }
    if !problems.is_empty() {
        bail!(
            "not merged, {} of {count} shards are not complete:\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    finished.digests = distinct_digests(&finished.reports);
    Ok((finished, per_shard))
}

/// Distinct repository@digest pairs among the reports: each was verified once by the
/// single-process audit, whichever shards its tags fell to.
fn distinct_digests(reports: &[ImageReport]) -> usize {
    reports
        .iter()
        .filter_map(|r| r.digest.as_deref().map(|d| verification_key(&r.image, d)))
        .collect::<HashSet<_>>()
        .len()
}

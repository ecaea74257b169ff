//! Writing `results.json` and the Markdown table, and describing the machine.

use std::path::Path;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

/// (key, what, target) of every headline figure, in table order.
const ROWS: &[(&str, &str, &str)] = &[
    (
        "warm_rps_ratio",
        "warm req/s, ivory ÷ null webhook",
        "≥ 0.7",
    ),
    (
        "warm_p99_ms",
        "p99 latency at half of ivory's max load (ms)",
        "≤ 1.5× null",
    ),
    (
        "warm_cpu_us",
        "server CPU per warm admission at half load (µs)",
        "≤ 30",
    ),
    (
        "warm_cpu_vs_null",
        "server CPU per warm admission ÷ the null webhook's per answer, same step",
        "≤ 3",
    ),
    (
        "warm_p99_vs_null",
        "p99 at half load ÷ the null webhook's p99 at the same rate",
        "≤ 1.5",
    ),
    (
        "cold_requests_per_tag_image",
        "registry requests, cold image by tag",
        "3",
    ),
    (
        "cold_requests_per_digest_image",
        "registry requests, cold image by digest",
        "2",
    ),
    (
        "herd_request_sets_64",
        "request sets for 64 concurrent admissions of one cold image",
        "1",
    ),
    (
        "late_responses_hung_registry",
        "responses later than the budget, registry never answers",
        "0",
    ),
    (
        "rss_mib_10k_cached",
        "peak RSS after the cached verifications (MiB)",
        "≤ 64",
    ),
    (
        "cold_verify_ratio_vs_cosign",
        "cold verify wall time, ivory ÷ cosign v2",
        "≤ 0.5",
    ),
];

/// CPU model, cores, memory and load average now.
pub(crate) fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: Option<u64> = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({
        "cpu": model,
        "cores": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "mem_gib": mem_kib.map(|k| (k as f64 / 1024.0 / 1024.0 * 10.0).round() / 10.0),
        "loadavg": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

/// Writes `results.json` and `results.md` into `out`.
pub(crate) fn write(out: &Path, results: &Value) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let json_path = out.join("results.json");
    let text = serde_json::to_string_pretty(results).context("serializing results")?;
    std::fs::write(&json_path, text + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = out.join("results.md");
    std::fs::write(&md_path, table(results))
        .with_context(|| format!("writing {}", md_path.display()))?;
    eprintln!("{}", table(results));
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

/// Adds the fleet figures (`fleet_*` keys, `details.fleet`) to `results.json` in `out`,
/// keeping the load harness's figures already there.
pub(crate) fn merge_fleet(out: &Path, figures: Value, details: Value) -> Result<()> {
    merge(out, "fleet", figures, details)
}

/// Adds `figures` (top-level keys) and `details.<section>` to `results.json` in `out`,
/// keeping every other figure already there.
pub(crate) fn merge(out: &Path, section: &str, figures: Value, details: Value) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let json_path = out.join("results.json");
    let mut results: Value = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    if let (Some(all), Some(fleet)) = (results.as_object_mut(), figures.as_object()) {
        for (k, v) in fleet {
            all.insert(k.clone(), v.clone());
        }
    }
    if !results["details"].is_object() {
        results["details"] = json!({});
    }
    results["details"][section] = details;
    let text = serde_json::to_string_pretty(&results).context("serializing results")?;
    std::fs::write(&json_path, text + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&figures).unwrap_or_default()
    );
    eprintln!("wrote {}", json_path.display());
    Ok(())
}

fn table(results: &Value) -> String {
    let mut md = String::from("| figure | key | result | target |\n|---|---|---|---|\n");
    for (key, what, target) in ROWS {
        md.push_str(&format!(
            "| {what} | `{key}` | {} | {target} |\n",
            results[*key]
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_one_row_per_headline_key() {
        let md = table(&json!({"warm_rps_ratio": 0.9, "late_responses_hung_registry": 0}));
        assert_eq!(md.lines().count(), 2 + ROWS.len());
        assert!(md.contains("| `warm_rps_ratio` | 0.9 | ≥ 0.7 |"));
        assert!(md.contains("| `late_responses_hung_registry` | 0 | 0 |"));
        assert!(md.contains("| `rss_mib_10k_cached` | null | ≤ 64 |"));
    }
}

//! The verdict-cache curve: `cache-probe --verdicts N` (a binary beside `ivory-bench`, built
//! with the product's allocator) once per size, each a fresh process.

use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

/// One probe process per size; their JSON lines in order.
pub(crate) fn curve(sizes: &[usize]) -> Result<Value> {
    let exe = std::env::current_exe().context("locating ivory-bench")?;
    let probe = exe.with_file_name("cache-probe");
    let mut points = Vec::new();
    for verdicts in sizes {
        let out = Command::new(&probe)
            .arg("--verdicts")
            .arg(verdicts.to_string())
            .output()
            .with_context(|| format!("running {}", probe.display()))?;
        ensure!(
            out.status.success(),
            "{} --verdicts {verdicts}: {}\n{}",
            probe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let point: Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("{} --verdicts {verdicts}: not JSON", probe.display()))?;
        points.push(point);
    }
    Ok(Value::Array(points))
}

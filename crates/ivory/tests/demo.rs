//! `scripts/demo.sh` end to end (debug builds): the real registry with the fixture images,
//! `ivory serve` with the sample key policy, and the printed story (pin, admit, deny, admit
//! from cache) that the README shows.

use std::process::Command;

use crate::util::BIN;

fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The value after `prefix` on the first line that has it (panics with the whole output).
fn after<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{out}"))
}

#[test]
fn demo_pins_admits_denies_and_admits_from_cache() {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/demo.sh"))
        .env("IVORY_DEMO_PROFILE", "debug")
        .env("IVORY_BIN", BIN)
        // The suite's own binaries: a `cargo build` of a different feature set would relink
        // target/debug/ivory under the tests running it (the dogfood test's two image builds).
        .envs(registry_bin().map(|r| ("IVORY_REGISTRY_BIN", r)))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    let host = after(&stdout, "registry  ")
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    let pins: Vec<&str> = stdout
        .lines()
        .filter_map(|l| {
            l.trim_start()
                .strip_prefix("mutate    pinned the tag to its digest: ")
        })
        .collect();
    assert_eq!(pins.len(), 2, "{stdout}");
    for (pin, repo) in pins.iter().zip(["sig-p256", "unsigned"]) {
        let (image, digest) = pin.split_once('@').unwrap();
        assert_eq!(image, format!("{host}/ivory/{repo}:v1"), "{stdout}");
        let hex = digest.strip_prefix("sha256:").unwrap();
        assert!(
            hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "{pin}"
        );
    }

    let decisions: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("validate  "))
        .collect();
    assert_eq!(decisions.len(), 3, "{stdout}");
    assert!(decisions[0].starts_with("admitted ("), "{stdout}");
    assert_eq!(
        decisions[1],
        format!(
            "denied: Policy sample-cosign-key failed: every {host}/ivory image must be signed \
             with fixtures/keys/cosign-p256.pub"
        )
    );
    assert!(
        decisions[2].starts_with("admitted from the verification cache in "),
        "{stdout}"
    );
    let hits = decisions[2]
        .rsplit("cache hits ")
        .next()
        .unwrap()
        .trim_end_matches(')');
    let (before, after) = hits.split_once(" -> ").unwrap();
    assert!(
        after.parse::<u64>().unwrap() > before.parse::<u64>().unwrap(),
        "the second admission is a cache hit: {stdout}"
    );
}

/// `ivory-testkit-registry` beside the `ivory` binary under test (same target folder and
/// profile), when it is there: `cargo test --workspace` builds it for ivory-testkit's own tests.
/// Without it the demo builds both binaries itself.
fn registry_bin() -> Option<std::path::PathBuf> {
    let registry = std::path::Path::new(BIN).with_file_name("ivory-testkit-registry");
    registry.exists().then_some(registry)
}

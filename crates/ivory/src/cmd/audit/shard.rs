//! `--shard I/N`: which entries of an audit one shard owns. Every shard lists every source
//! the same way and keeps the entries whose name hashes to its index, so the split depends on
//! neither the registry's listing order nor the other shards, and it is by image (repository
//! and tag), so a repository holding most of the tags is spread over all shards.

use sha2::{Digest as _, Sha256};

/// One shard of an audit split into `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shard {
    /// This shard's index, `0..count`.
    pub(crate) index: u32,
    /// How many shards the audit is split into.
    pub(crate) count: u32,
}

impl Shard {
    /// Whether this shard audits (and reports) `entry`: an image as listed (`host/repo:tag`)
    /// or the subject of a listing problem (a host or a repository).
    pub(crate) fn owns(&self, entry: &str) -> bool {
        let hash = Sha256::digest(entry.as_bytes());
        let mut first = [0_u8; 8];
        first.copy_from_slice(&hash[..8]);
        u64::from_be_bytes(first) % u64::from(self.count) == u64::from(self.index)
    }

    /// `I/N`, as the flag spells it.
    pub(crate) fn label(&self) -> String {
        format!("{}/{}", self.index, self.count)
    }

    /// The stem of this shard's files in `--shard-out`: `shard-I-of-N`.
    pub(crate) fn file_stem(&self) -> String {
        format!("shard-{}-of-{}", self.index, self.count)
    }
}

/// Parses `I/N` with `0 <= I < N` (clap's value parser: its errors are shown as they are).
pub(crate) fn parse(text: &str) -> Result<Shard, String> {
    let (index, count) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?}: expected I/N, e.g. 0/4"))?;
    let number = |part: &str| {
        part.trim()
            .parse::<u32>()
            .map_err(|e| format!("{text:?}: {part:?} is not a number: {e}"))
    };
    let (index, count) = (number(index)?, number(count)?);
    if count == 0 || index >= count {
        return Err(format!(
            "{text:?}: the index must be below the count (0/{count} to {}/{count})",
            count.saturating_sub(1)
        ));
    }
    Ok(Shard { index, count })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_has_exactly_one_shard_and_shards_are_balanced() {
        let shards: Vec<Shard> = (0..4).map(|index| Shard { index, count: 4 }).collect();
        let mut sizes = [0_usize; 4];
        // One repository holding most tags, as registries often do.
        for tag in 0..4000 {
            let image = format!("registry.test/big/app:v{tag}");
            let owners: Vec<&Shard> = shards.iter().filter(|s| s.owns(&image)).collect();
            assert_eq!(owners.len(), 1, "{image}");
            sizes[owners[0].index as usize] += 1;
        }
        for size in sizes {
            assert!((900..1100).contains(&size), "unbalanced: {sizes:?}");
        }
    }

    #[test]
    fn the_split_is_stable_and_the_flag_is_checked() {
        let shard = parse("1/3").unwrap();
        assert_eq!(shard, Shard { index: 1, count: 3 });
        assert_eq!(shard.file_stem(), "shard-1-of-3");
        // The same name always lands on the same shard (the merge relies on it).
        let owner = |name: &str| (0..3).find(|&index| Shard { index, count: 3 }.owns(name));
        assert_eq!(owner("r.test/a:1"), owner("r.test/a:1"));
        assert!(parse("3/3").is_err());
        assert!(parse("0/0").is_err());
        assert!(parse("1").is_err());
        assert!(parse("a/2").is_err());
    }
}

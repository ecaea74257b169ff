//! Hashing of keys a request chooses: image strings, verification jobs, kept results.
//!
//! Every map and cache keyed by such data hashes with its own key, drawn from the operating
//! system's random source (ahash's `runtime-rng`), so whoever writes a Pod cannot choose images
//! that all land in one bucket (hash flooding). ahash does so with fewer instructions than std's
//! SipHash, which the warm path paid for on every lookup (BENCHMARKS.md, "Fifth round").

/// The hasher builder of every map and cache keyed by request-chosen data.
pub type KeyedState = ahash::RandomState;

/// A hash map keyed by request-chosen data.
pub type KeyedMap<K, V> = std::collections::HashMap<K, V, KeyedState>;

/// A hasher builder with a fresh random key.
pub fn keyed_state() -> KeyedState {
    KeyedState::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_map_hashes_with_a_key_of_its_own() {
        let image = "registry.example/app@sha256:0123";
        let (one, other) = (keyed_state(), keyed_state());
        assert_eq!(one.hash_one(image), one.hash_one(image));
        // An unkeyed or fixed-key hasher gives equal hashes here, and lets a request aim its
        // keys at one bucket of every server's maps.
        assert_ne!(one.hash_one(image), other.hash_one(image));
        assert_ne!(
            KeyedMap::<&str, ()>::default().hasher().hash_one(image),
            KeyedMap::<&str, ()>::default().hasher().hash_one(image),
        );
    }
}

//! The series of a labelled family the request path counts in, found by their label values
//! without building a label set: `Family::get_or_create` takes owned labels, so each count
//! allocated its label strings and hashed them with SipHash, ~1 k instructions a policy result
//! (BENCHMARKS.md, issue 47). Each series is still created by its family, once, and is the
//! same counter or histogram the family exports.

use std::hash::Hash;
use std::sync::RwLock;

use ivory_plumbing::keyed::{KeyedMap, KeyedState, keyed_state};
use prometheus_client::metrics::family::{Family, MetricConstructor};

/// A label set of `N` string labels.
pub(super) trait StrLabels<const N: usize>: Clone + Hash + Eq {
    /// The label set with these values, in the set's field order.
    fn of(values: [&str; N]) -> Self;
    /// Whether this set's values are `values`.
    fn is(&self, values: &[&str; N]) -> bool;
}

/// The series of one family seen so far, by the hash of their label values. As many as the
/// family has: the label values the request path counts with are bounded (policies loaded,
/// outcomes, causes).
pub(super) struct Series<L, M> {
    hasher: KeyedState,
    by_hash: RwLock<KeyedMap<u64, Vec<(L, M)>>>,
}

impl<L, M> Default for Series<L, M> {
    fn default() -> Self {
        Self {
            hasher: keyed_state(),
            by_hash: RwLock::new(KeyedMap::default()),
        }
    }
}

impl<L, M: Clone> Series<L, M> {
    /// `family`'s series for `values`, created there on first use.
    pub(super) fn get<const N: usize, C>(&self, family: &Family<L, M, C>, values: [&str; N]) -> M
    where
        L: StrLabels<N>,
        C: MetricConstructor<M>,
    {
        let hash = self.hasher.hash_one(values);
        let found = self.by_hash.read().ok().and_then(|by_hash| {
            let bucket = by_hash.get(&hash)?;
            bucket
                .iter()
                .find(|(labels, _)| labels.is(&values))
                .map(|(_, metric)| metric.clone())
        });
        if let Some(metric) = found {
            return metric;
        }
        let labels = L::of(values);
        let metric = family.get_or_create(&labels).clone();
        if let Ok(mut by_hash) = self.by_hash.write() {
            let bucket = by_hash.entry(hash).or_default();
            if !bucket.iter().any(|(known, _)| known.is(&values)) {
                bucket.push((labels, metric.clone()));
            }
        }
        metric
    }
}

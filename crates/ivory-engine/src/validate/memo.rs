//! Memoized policy evaluations: a policy whose expressions read only its `images`, its
//! attestors and attestations, its variables and the verification answers (Kyverno's common
//! shape) comes to the same result whenever those are the same. Such a result is kept, keyed
//! by the policy version (its hash: kind, namespace, name and spec) and its `images`, and
//! reused only while every verification answer it read is the same answer, compared whole.
//!
//! So a result is invalidated by exactly what can change it: a policy reload changes the hash,
//! a verdict that expires or is evicted is asked again and compared again, and an answer that
//! is an error (an unreachable registry, a spent budget) is never part of a kept result: such a
//! policy is evaluated afresh. PolicyExceptions are applied before policies reach this stage.
//! Results the budget or the deadline shaped, and errors, are never kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ivory_plumbing::keyed::{KeyedState, keyed_state};

use super::host::Evidence;
use super::outcome::Evaluated;
use super::plan::{ImagesByExtractor, Plan};
use super::prefetch::{Outcome, Prefetched, VerifyKey};
use super::reuse::RoutePlans;
use crate::decision::Status;
use crate::verifier::Verification;

/// Bytes of kept results, over all policies: entries are weighed by their strings and the
/// attestation statements they hold, so a few large statements cannot grow memory unbounded.
const DEFAULT_BYTES: u64 = 32 << 20;
/// Larger requests are evaluated afresh: their key would cost more to compare than it saves.
const MAX_IMAGES: usize = 64;
const MAX_ANSWERS: usize = 256;

/// Kept policy results, shared by every request a server or CLI run judges.
pub struct DecisionMemo {
    entries: moka::sync::Cache<MemoKey, Arc<Entry>, KeyedState>,
    hits: AtomicU64,
    /// Whole routes' decisions, reused for the same matching inputs ([`super::reuse`]).
    routes: RoutePlans,
}

impl Default for DecisionMemo {
    fn default() -> Self {
        Self::with_byte_budget(DEFAULT_BYTES)
    }
}

impl std::fmt::Debug for DecisionMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionMemo")
            .field("entries", &self.entries.entry_count())
            .finish()
    }
}

impl DecisionMemo {
    /// A memo holding policy results of about `bytes` in all.
    pub fn with_byte_budget(bytes: u64) -> Self {
        Self {
            entries: moka::sync::Cache::builder()
                .max_capacity(bytes)
                .weigher(|key: &MemoKey, entry: &Arc<Entry>| {
                    u32::try_from(key.bytes().saturating_add(entry.bytes)).unwrap_or(u32::MAX)
                })
                .build_with_hasher(keyed_state()),
            hits: AtomicU64::new(0),
            routes: RoutePlans::default(),
        }
    }

    /// How many policy results were reused instead of evaluated.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// How many whole decisions were reused for a route's matching inputs.
    pub fn route_hits(&self) -> u64 {
        self.routes.hits()
    }

    pub(super) fn routes(&self) -> &RoutePlans {
        &self.routes
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct MemoKey {
    /// The policy version.
    policy: String,
    /// Autogen variants share the hash of the policy they come from.
    autogen: Option<String>,
    /// The plan's own map, shared.
    images: Arc<ImagesByExtractor>,
}

impl MemoKey {
    /// Roughly what the key holds, for the byte budget.
    fn bytes(&self) -> usize {
        let images: usize = self.images.iter().map(|(k, v)| k.len() + strings(v)).sum();
        self.policy.len() + images
    }
}

fn strings(list: &[String]) -> usize {
    list.iter().map(|s| s.len() + 24).sum()
}

struct Entry {
    /// Roughly what the entry holds (answers, statements, messages), for the byte budget.
    bytes: usize,
    /// Every verification answer the policy could read, in key order.
    answers: Vec<(VerifyKey, Verification)>,
    evaluated: Evaluated,
    evidence: Evidence,
}

/// A plan whose result may be kept or reused, with its key.
pub(super) struct Memoizable {
    key: MemoKey,
}

/// Whether `plan`'s result is a function of its key and verification answers alone.
pub(super) fn memoizable(plan: &Plan<'_>) -> Option<Memoizable> {
    let policy = plan.policy;
    let pure = plan.facts.pure
        && plan.undigested.is_empty()
        && plan.image_data.is_empty()
        && plan.late_image_data.is_empty()
        && !plan.can_evaluate_again()
        && plan.matched.len() <= MAX_IMAGES
        && plan.keys.len() <= MAX_ANSWERS;
    pure.then(|| Memoizable {
        key: MemoKey {
            policy: policy.hash.clone(),
            autogen: policy.autogen_config.clone(),
            images: Arc::clone(&plan.images),
        },
    })
    .filter(|_| !policy.hash.is_empty())
}

/// The verification answers `plan` could read, or `None` when one is not a verdict.
fn answers<'p>(
    plan: &'p Plan<'_>,
    prefetched: &'p Prefetched,
) -> Option<Vec<(&'p VerifyKey, &'p Verification)>> {
    plan.keys
        .iter()
        .map(|(key, index)| match prefetched.outcome(*index) {
            Some(Outcome::Verify(Ok(verification))) => Some((key, verification)),
            _ => None,
        })
        .collect()
}

impl DecisionMemo {
    /// The kept result of `plan` with the evidence its evaluation recorded, when every answer
    /// it could read is the one it was kept with.
    pub(super) fn get(
        &self,
        memoizable: &Memoizable,
        plan: &Plan<'_>,
        prefetched: &Prefetched,
    ) -> Option<(Evaluated, Evidence)> {
        let entry = self.entries.get(&memoizable.key)?;
        let now = answers(plan, prefetched)?;
        let same = now.len() == entry.answers.len()
            && now
                .iter()
                .zip(&entry.answers)
                .all(|((k, v), (kept_k, kept_v))| *k == kept_k && *v == kept_v);
        if !same {
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some((entry.evaluated.clone(), entry.evidence.snapshot()))
    }

    /// Keeps `evaluated` (with the `evidence` it recorded) for `plan`, unless the budget, the
    /// deadline or an error shaped it, or an answer it could read was not a verdict.
    pub(super) fn put(
        &self,
        memoizable: Memoizable,
        plan: &Plan<'_>,
        prefetched: &Prefetched,
        evaluated: &Evaluated,
        evidence: &Evidence,
    ) {
        let Some(answers) = answers(plan, prefetched).filter(|_| decided(evaluated)) else {
            return;
        };
        let answer_bytes: usize = answers
            .iter()
            .map(|(key, verification)| {
                let payload = match verification {
                    Verification::Verified {
                        payload: Some(statement),
                        ..
                    } => serde_json::to_vec(statement).map_or(0, |b| b.len()),
                    _ => 0,
                };
                key.image.len() + key.attestor.len() + 256 + payload
            })
            .sum();
        let result = &evaluated.result;
        let entry = Entry {
            bytes: 512
                + answer_bytes
                + result.message.len()
                + strings(&result.images)
                + strings(&evaluated.skipped),
            answers: answers
                .into_iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            evaluated: evaluated.clone(),
            evidence: evidence.snapshot(),
        };
        self.entries.insert(memoizable.key, Arc::new(entry));
    }
}

/// Whether `evaluated` is a result the memo may keep: a pass or a fail that neither the budget
/// nor an image it skipped shaped.
pub(super) fn decided(evaluated: &Evaluated) -> bool {
    matches!(evaluated.result.status, Status::Pass | Status::Fail)
        && !evaluated.budget_exhausted
        && evaluated.skipped.is_empty()
}

/// Whether the policy's expressions (those run after the prefetch) read only pure inputs.
#[cfg(test)]
fn policy_is_pure(policy: &ivory_policy::compiled::CompiledPolicy) -> bool {
    super::calls::programs(policy).all(super::calls::reads_only_pure_inputs)
}

#[cfg(test)]
mod tests;

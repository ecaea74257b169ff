//! Cost limits of CEL evaluation, after Kubernetes' (`checker.Cost` and the interpreter's cost
//! tracker): cel-rust has neither, so ivory adds both.
//!
//! * [`estimate`] bounds an expression's worst-case cost at compile time, sizing every list
//!   and string that comes from the request by the largest request ivory accepts; an
//!   expression over [`STATIC_COST_LIMIT`] is refused when its policy loads.
//! * [`instrument`] rewrites every comprehension so that each iteration (and each string or
//!   list a function builds) charges this thread's [`Meter`]; an evaluation stops with
//!   [`crate::EvalError::CostExceeded`] once it has spent its limit, or once its deadline has
//!   passed.
//! * A [`CostBudget`] shares one allowance among all evaluations of a policy for a request.

pub(crate) mod estimate;
pub(crate) mod functions;
pub(crate) mod instrument;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

/// Largest input an expression can see: ivory-server's default request body limit. Lists and
/// strings from the request are sized by it, as Kubernetes sizes unbounded lists by its
/// maximum request size.
pub const MAX_INPUT_BYTES: u64 = 3 * 1024 * 1024;
/// Fewest bytes one element of a serialized list takes (`0,`): bounds a list's length.
pub const MIN_ELEMENT_BYTES: u64 = 2;
/// Largest cost one evaluation may spend (Kubernetes' `PerCallLimit`).
pub const PER_EVALUATION_LIMIT: u64 = 1_000_000;
/// Largest cost all evaluations of one policy for one request may spend together
/// (Kubernetes' `RuntimeCELCostBudget`).
pub const POLICY_BUDGET: u64 = 10_000_000;
/// Largest worst-case cost an expression may have to be accepted. It is far above
/// [`PER_EVALUATION_LIMIT`] because the estimate assumes a maximum-size request: one pass over
/// a request-sized list passes (even scanning a request-sized string per element), a pass
/// over a request-sized list nested in a pass over another does not.
pub const STATIC_COST_LIMIT: u64 = 1_000_000_000_000;
/// Size assumed for a value the policy defines (see [`crate::Scope::policy_defined`]).
pub const POLICY_VALUE_BYTES: u64 = 64 * 1024;
/// Elements assumed for the largest list, map or string inside a policy-defined value.
pub(crate) const POLICY_VALUE_ITEMS: u64 = 1024;
/// Strings cost one unit per this many bytes built or scanned (Kubernetes' 0.1 per byte).
pub(crate) const BYTES_PER_UNIT: u64 = 10;
/// Cost an evaluation may spend on an async runtime's worker thread: one that needs more is
/// started again where it cannot hold up the worker's other tasks (see [`crate::Program::evaluate`]).
/// Cheap evaluations, the usual case, never pay for moving.
pub(crate) const INLINE_SLICE: u64 = 20_000;
/// Charges between two deadline checks: reading the clock on every charge would dominate.
const CHARGES_PER_CLOCK_READ: u32 = 64;

/// A cost allowance shared by several evaluations (all of one policy for one request), and
/// the deadline none of them may outlive.
#[derive(Debug)]
pub struct CostBudget {
    remaining: AtomicU64,
    deadline: Option<Instant>,
}

impl CostBudget {
    /// `total` units, spendable until `deadline`.
    pub fn new(total: u64, deadline: Option<Instant>) -> Self {
        Self {
            remaining: AtomicU64::new(total),
            deadline,
        }
    }

    /// The budget of one policy evaluation ([`POLICY_BUDGET`]).
    pub fn for_policy(deadline: Option<Instant>) -> Self {
        Self::new(POLICY_BUDGET, deadline)
    }

    /// Cost units still available to evaluations charged to this budget.
    pub fn remaining(&self) -> u64 {
        self.remaining.load(Ordering::Relaxed)
    }

    /// The deadline of every evaluation charged to this budget.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    pub(crate) fn spend(&self, used: u64) {
        let _ = self
            .remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                Some(r.saturating_sub(used))
            });
    }
}

/// Why an evaluation was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exceeded {
    /// The evaluation spent the per-evaluation limit.
    EvaluationLimit(u64),
    /// The evaluation spent what was left of the policy's budget.
    PolicyBudget(u64),
    /// The request's deadline passed.
    Deadline,
    /// The evaluation outgrew [`INLINE_SLICE`] on an async worker; never reported.
    InlineSlice,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::EvaluationLimit(limit) => {
                write!(f, "the cost limit of {limit} per evaluation is spent")
            }
            Self::PolicyBudget(total) => write!(
                f,
                "the policy's cost budget of {total} per request is spent"
            ),
            Self::Deadline => f.write_str("the request's deadline has passed"),
            Self::InlineSlice => f.write_str("the evaluation outgrew its inline slice"),
        }
    }
}

/// The limits one evaluation runs under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub limit: u64,
    /// What reaching `limit` means.
    pub on_limit: Exceeded,
    pub deadline: Option<Instant>,
}

impl Limits {
    pub(crate) fn of(budget: Option<&CostBudget>) -> Self {
        let evaluation = Self {
            limit: PER_EVALUATION_LIMIT,
            on_limit: Exceeded::EvaluationLimit(PER_EVALUATION_LIMIT),
            deadline: None,
        };
        let Some(budget) = budget else {
            return evaluation;
        };
        let remaining = budget.remaining();
        if remaining < PER_EVALUATION_LIMIT {
            Self {
                limit: remaining,
                on_limit: Exceeded::PolicyBudget(POLICY_BUDGET),
                deadline: budget.deadline,
            }
        } else {
            Self {
                deadline: budget.deadline,
                ..evaluation
            }
        }
    }

    /// The first slice of an evaluation on an async worker, when the evaluation may need more.
    pub(crate) fn inline_slice(&self) -> Option<Self> {
        (self.limit > INLINE_SLICE && on_async_worker()).then_some(Self {
            limit: INLINE_SLICE,
            on_limit: Exceeded::InlineSlice,
            deadline: self.deadline,
        })
    }

    /// The limits left after `used` was spent.
    pub(crate) fn after(&self, used: u64) -> Self {
        Self {
            limit: self.limit.saturating_sub(used),
            ..*self
        }
    }

    /// Whether the evaluation may not even start: only a spent cost limit stops it here. A
    /// passed deadline does not, because registry answers are prefetched until the deadline and
    /// the expressions that read them (and turn a missed answer into the failurePolicy's
    /// outcome) run after it; the deadline stops an evaluation only once it does real work
    /// (checked every [`CHARGES_PER_CLOCK_READ`] charges).
    pub(crate) fn exhausted(&self) -> Option<Exceeded> {
        (self.limit == 0).then_some(self.on_limit)
    }
}

/// Whether this thread is a worker of a multi-threaded Tokio runtime, where a long evaluation
/// would hold up other requests' tasks.
fn on_async_worker() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Runs `f`, which may take long, without holding up the async worker it is called on: Tokio
/// moves the worker's other tasks to another thread meanwhile.
pub(crate) fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    if on_async_worker() {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// The running count of one evaluation on this thread.
#[derive(Debug)]
struct Meter {
    used: u64,
    limits: Limits,
    charges: u32,
    exceeded: Option<Exceeded>,
}

thread_local! {
    static METER: RefCell<Option<Meter>> = const { RefCell::new(None) };
}

/// What a metered evaluation spent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spent {
    pub used: u64,
    pub exceeded: Option<Exceeded>,
}

/// Runs `f` with a meter under `limits` installed on this thread (restoring any outer one).
pub(crate) fn metered<T>(limits: Limits, f: impl FnOnce() -> T) -> (T, Spent) {
    let outer = METER.with(|m| {
        m.borrow_mut().replace(Meter {
            used: 0,
            limits,
            charges: 0,
            exceeded: None,
        })
    });
    let out = f();
    let meter = METER.with(|m| std::mem::replace(&mut *m.borrow_mut(), outer));
    let spent = meter.map_or(
        Spent {
            used: 0,
            exceeded: None,
        },
        |m| Spent {
            used: m.used,
            exceeded: m.exceeded,
        },
    );
    (out, spent)
}

/// Charges `units` to this thread's evaluation. Once the evaluation has exceeded its limits
/// every further charge fails too, so that no operator can absorb the failure and go on.
pub(crate) fn charge(units: u64) -> Result<(), Exceeded> {
    METER.with(|m| {
        let mut slot = m.borrow_mut();
        // Every evaluation runs under a meter; a charge without one is a bug: refuse.
        let Some(meter) = slot.as_mut() else {
            return Err(Exceeded::EvaluationLimit(0));
        };
        if let Some(exceeded) = meter.exceeded {
            return Err(exceeded);
        }
        meter.used = meter.used.saturating_add(units);
        meter.charges = meter.charges.wrapping_add(1);
        let exceeded = if meter.used > meter.limits.limit {
            Some(meter.limits.on_limit)
        } else if meter.charges % CHARGES_PER_CLOCK_READ == 0
            && meter
                .limits
                .deadline
                .is_some_and(|d| ivory_clock::now() >= d)
        {
            Some(Exceeded::Deadline)
        } else {
            None
        };
        meter.exceeded = exceeded;
        exceeded.map_or(Ok(()), Err)
    })
}

/// Cost of building or scanning `bytes` bytes of string.
pub(crate) fn string_units(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(BYTES_PER_UNIT)
}

#[cfg(test)]
mod tests;

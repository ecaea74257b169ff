//! Kyverno's `time` library (`kyverno.time`, compiled into Kyverno 1.19's image-verification
//! evaluator): `time.now()`, `time.truncate(ts, d)` and `time.toCron(ts)`.
//!
//! `time.now()` is the host's wall clock ([`crate::Host::wall_time`]), so that a test fixes the
//! time and the engine knows which programs read it (their results are never memoized).

use cel::Value;
use cel::common::value::CowVal;
use cel::{ExecutionError, FunctionContext};
use chrono::{DateTime, Datelike, FixedOffset, TimeDelta, Timelike};

use super::{FunctionError, Registry, call_values, no_overload};
use crate::activation::{HostOp, call_host};

/// The names of `time.now` (the one function of the library that reads outside its arguments).
pub const TIME_NOW: [&str; 1] = ["time.now"];

/// Seconds from Go's zero time (0001-01-01T00:00:00Z), from which Go's `Time.Truncate`
/// counts, to the Unix epoch.
const GO_ZERO_TO_UNIX_SECONDS: i128 = 62_135_596_800;
const NANOS_PER_SECOND: i128 = 1_000_000_000;

pub(super) fn register(r: &mut Registry) {
    for name in TIME_NOW {
        r.add_raw(name, Box::new(now));
    }
    r.add("time.truncate", |a| match a {
        [Value::Timestamp(ts), Value::Duration(d)] => Some(truncate(ts, *d)),
        _ => None,
    });
    r.add("time.toCron", |a| match a {
        [Value::Timestamp(ts)] => Some(Ok(super::string(to_cron(ts)))),
        _ => None,
    });
}

fn now<'c, 'd>(ftx: &mut FunctionContext<'c, 'd>) -> Result<CowVal<'c, 'd>, ExecutionError> {
    let name = TIME_NOW[0];
    if ftx.this.is_some() {
        return Err(ExecutionError::not_supported_as_method(name, Value::Null));
    }
    let args = call_values(ftx)?;
    if !args.is_empty() {
        return Err(no_overload(name, &args, false));
    }
    let value = call_host(ftx, HostOp::WallTime, args)?;
    value.try_into().map(CowVal::Owned)
}

/// Go's `Time.Truncate`: rounds down to a multiple of `d` counted from Go's zero time (not
/// from the Unix epoch: they differ for durations that do not divide a day), in the
/// timestamp's own offset; `d <= 0` leaves the time unchanged.
fn truncate(ts: &DateTime<FixedOffset>, d: TimeDelta) -> Result<Value, FunctionError> {
    let step = i128::from(d.num_seconds()) * NANOS_PER_SECOND + i128::from(d.subsec_nanos());
    if step <= 0 {
        return Ok(Value::Timestamp(*ts));
    }
    let since_zero = (i128::from(ts.timestamp()) + GO_ZERO_TO_UNIX_SECONDS) * NANOS_PER_SECOND
        + i128::from(ts.timestamp_subsec_nanos());
    let excess = since_zero.rem_euclid(step);
    let excess = i64::try_from(excess)
        .map(TimeDelta::nanoseconds)
        .map_err(|_| FunctionError::OutOfRange("time.truncate: duration too large".to_owned()))?;
    ts.checked_sub_signed(excess)
        .map(Value::Timestamp)
        .ok_or_else(|| {
            FunctionError::OutOfRange("time.truncate: timestamp out of range".to_owned())
        })
}

/// `minute hour day-of-month month day-of-week` in the timestamp's offset (Sunday is 0), as
/// Kyverno writes it.
fn to_cron(ts: &DateTime<FixedOffset>) -> String {
    format!(
        "{} {} {} {} {}",
        ts.minute(),
        ts.hour(),
        ts.day(),
        ts.month(),
        ts.weekday().num_days_from_sunday()
    )
}

//! [`eventually`]: the one wait of the tests for what happens asynchronously (a server
//! reloading, a connection closing, the API server applying a webhook configuration).

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// The first pause between two checks: short, so a check that passes soon costs little.
const FIRST_POLL: Duration = Duration::from_millis(10);

/// The longest pause between two checks, so a slow wait does not hammer what it asks.
const MAX_POLL: Duration = Duration::from_millis(200);

/// What [`eventually`] waited for, how long, and why its last check failed.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}: {last}")]
pub struct Timeout {
    /// What the caller waited for.
    pub what: String,
    /// How long it waited.
    pub timeout: Duration,
    /// The last check's failure.
    pub last: String,
}

/// Why one check of [`eventually`] has not passed yet.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotYet(pub String);

/// The outcome of one check of [`eventually`]: `true` or `Ok` ends the wait.
pub trait Check {
    /// What the wait returns once the check passes.
    type Value;
    /// The value, or why the check failed this time.
    fn passed(self) -> Result<Self::Value, NotYet>;
}

impl Check for bool {
    type Value = ();

    fn passed(self) -> Result<(), NotYet> {
        if self {
            Ok(())
        } else {
            Err(NotYet("the check was still false".to_owned()))
        }
    }
}

impl<T, E: Display> Check for Result<T, E> {
    type Value = T;

    fn passed(self) -> Result<T, NotYet> {
        self.map_err(|err| NotYet(err.to_string()))
    }
}

/// Runs `check` until it returns `true` or `Ok`, for at most `timeout`: polling at 10 ms at
/// first, backing off to 200 ms. It checks at least once, and once more at the deadline; on
/// timeout the error names `what` and the last check's failure.
pub async fn eventually<C, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<C::Value, Timeout>
where
    C: Check,
    F: FnMut() -> Fut,
    Fut: Future<Output = C>,
{
    let deadline = ivory_clock::now() + timeout;
    let mut pause = FIRST_POLL;
    loop {
        let last = match check().await.passed() {
            Ok(value) => return Ok(value),
            Err(NotYet(last)) => last,
        };
        let now = ivory_clock::now();
        if now >= deadline {
            return Err(Timeout {
                what: what.to_owned(),
                timeout,
                last,
            });
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(MAX_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn eventually_retries_until_ok() {
        let mut calls = 0;
        let value = eventually("third call", Duration::from_secs(5), || {
            calls += 1;
            let result = if calls < 3 { Err("not yet") } else { Ok(calls) };
            async move { result }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn eventually_waits_for_a_condition_to_hold() {
        let mut calls = 0;
        eventually("the fifth call", Duration::from_secs(5), || {
            calls += 1;
            let done = calls >= 5;
            async move { done }
        })
        .await
        .unwrap();
        assert_eq!(calls, 5);
    }

    #[tokio::test]
    async fn eventually_times_out_naming_what_and_the_last_error() {
        let err = eventually("never", Duration::from_millis(300), || async {
            Err::<(), _>("still failing")
        })
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("never") && text.contains("still failing"),
            "{text}"
        );
        let err = eventually("false", Duration::from_millis(50), || async { false })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("still false"), "{err}");
    }
}

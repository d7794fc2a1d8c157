//! How a worker waits and retries, in one place: the backoff between attempts at a shard
//! that was not reached (the exponential waits of `sparta_blob::Backoff`, the policy object
//! reads retry on too), polling until a deadline while the cluster comes up, and saying so
//! when a call waits long on a shard that does not answer (stopped, hung, overloaded).

use std::future::Future;
use std::time::{Duration, Instant};

use sparta_blob::Backoff;

/// The first delay after a failed attempt.
const FIRST: Duration = Duration::from_millis(50);

/// Delays between attempts: 50 ms, doubling, at most `cap` apart, without end (the caller
/// stops by its own count and deadline).
pub(crate) fn delays(cap: Duration) -> impl Iterator<Item = Duration> {
    Backoff::new(u32::MAX, FIRST, cap).delays()
}

/// Calls `f` every `every` until it succeeds, fails with an error `again` does not accept,
/// or `deadline` has passed (then its last error). `waiting` sees each error retried.
pub(crate) fn poll_until<T, E>(
    deadline: Instant,
    every: Duration,
    mut f: impl FnMut() -> Result<T, E>,
    again: impl Fn(&E) -> bool,
    mut waiting: impl FnMut(&E),
) -> Result<T, E> {
    loop {
        match f() {
            Err(e) if again(&e) && Instant::now() < deadline => {
                waiting(&e);
                std::thread::sleep(every);
            }
            r => return r,
        }
    }
}

/// Awaits `call` to PS shard `shard` at `addr` (`what`: the request). Once it has waited
/// `after`, logs a warning naming the shard and its address, again every `after` while it
/// lasts, and a last line when the answer comes (or the wait ends otherwise): a shard that
/// stopped answering without closing its connections (SIGSTOP, a hang) is otherwise silent
/// until the RPC deadline.
pub(crate) async fn warn_while_waiting<T>(
    call: impl Future<Output = T>,
    after: Duration,
    shard: usize,
    addr: &str,
    what: &str,
) -> T {
    let after = after.max(Duration::from_millis(1));
    let mut call = std::pin::pin!(call);
    let start = Instant::now();
    let mut warned = false;
    loop {
        match tokio::time::timeout(after, &mut call).await {
            Ok(v) => {
                if warned {
                    tracing::warn!(
                        "PS shard {shard} at {addr}: {what} ended after {:.1} s",
                        start.elapsed().as_secs_f64()
                    );
                }
                return v;
            }
            Err(_) => {
                warned = true;
                tracing::warn!(
                    "PS shard {shard} at {addr}: no answer to {what} for {:.0} s, still waiting \
                     (is the PS stopped, hung or overloaded? a sync step or checkpoint also \
                     waits for the slowest worker: see the PS's log)",
                    start.elapsed().as_secs_f64()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_50_ms_up_to_the_cap() {
        let ms: Vec<u128> = delays(Duration::from_secs(1))
            .take(8)
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(ms, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        let ms: Vec<u128> = delays(Duration::from_millis(400))
            .take(6)
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(ms, [50, 100, 200, 400, 400, 400]);
    }

    #[test]
    fn polling_stops_at_success_at_a_refused_error_and_at_the_deadline() {
        let mut n = 0;
        let far = Instant::now() + Duration::from_secs(60);
        let ok: Result<u32, &str> = poll_until(
            far,
            Duration::ZERO,
            || {
                n += 1;
                if n < 3 {
                    Err("not yet")
                } else {
                    Ok(n)
                }
            },
            |_| true,
            |_| {},
        );
        assert_eq!(ok, Ok(3));
        let mut calls = 0;
        let refused: Result<(), &str> = poll_until(
            far,
            Duration::ZERO,
            || {
                calls += 1;
                Err("fatal")
            },
            |e| *e != "fatal",
            |_| {},
        );
        assert_eq!((refused, calls), (Err("fatal"), 1));
        let mut waited = 0;
        let past = Instant::now();
        let late: Result<(), &str> = poll_until(
            past,
            Duration::ZERO,
            || Err("down"),
            |_| true,
            |_| waited += 1,
        );
        assert_eq!((late, waited), (Err("down"), 0));
    }
}

//! The clock's time samples behind a wall-clock TTL (`max_idle_seconds`): which step a
//! table's clock showed at a past instant, so no row needs a time of its own.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most (step, time) samples a table keeps for `max_idle_seconds`.
const CLOCK_SAMPLES: usize = 256;

/// (step, time) samples of a table's clock: what step the clock showed at a past instant, so
/// a wall-clock TTL needs no per-row time. Samples are taken at most every `interval`
/// (max(1 s, ttl / 128)); those older than the newest one at or before `now - ttl` are
/// dropped, and at [`CLOCK_SAMPLES`] every other one is, so the log stays small.
#[derive(Default)]
pub(crate) struct ClockLog {
    samples: VecDeque<(u32, Instant)>,
}

impl ClockLog {
    /// Records `step` at `now` (if `interval` passed since the last sample) and returns the
    /// step the clock showed `ttl` before `now`: the step of the newest sample at or before
    /// `now - ttl` (`None` while the log does not reach back that far).
    pub(crate) fn step_before(&mut self, step: u32, now: Instant, ttl: Duration) -> Option<u32> {
        let interval = (ttl / 128).max(Duration::from_secs(1));
        let due = self
            .samples
            .back()
            .is_none_or(|&(_, t)| now.saturating_duration_since(t) >= interval);
        if due {
            if self.samples.len() >= CLOCK_SAMPLES {
                // Thin: keep every other sample (the newest and the oldest stay).
                let kept: VecDeque<_> = self
                    .samples
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i % 2 == 0)
                    .map(|(_, s)| *s)
                    .collect();
                self.samples = kept;
            }
            self.samples.push_back((step, now));
        }
        let cut = now.checked_sub(ttl)?;
        while self.samples.len() >= 2 && self.samples[1].1 <= cut {
            self.samples.pop_front();
        }
        let &(s, t) = self.samples.front()?;
        (t <= cut).then_some(s)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.samples.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_log_stays_bounded() {
        let mut log = ClockLog::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(100_000);
        for i in 0..10_000u32 {
            log.step_before(i, t0 + Duration::from_secs(u64::from(i) * 1000), ttl);
            assert!(log.len() <= CLOCK_SAMPLES, "{} samples", log.len());
        }
        // Still answers: the step 100 000 s before the last sample is about 9 999 - 100.
        let s = log
            .step_before(10_000, t0 + Duration::from_secs(10_000_000), ttl)
            .unwrap();
        assert!((9_800..=9_900).contains(&s), "{s}");
    }
}

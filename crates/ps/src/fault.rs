//! A test hook: a shard that applies a push and then answers as if the connection broke
//! before the answer got out, so tests can check that the worker's retry is not applied twice.
//! Built from explicit handles in [`crate::PsConfig`]; off unless a test (or the hidden
//! `sparta ps --test-drop-answer` flag) sets a rule.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use sparta_proto::metrics::Rpc;

use crate::error::Refusal;

/// When a dropped answer is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Once the push was applied and its answer is ready (a sync step completed).
    Applied,
    /// At once, while the push is still being applied (e.g. it waits at the sync barrier):
    /// the apply goes on, and the worker's retry arrives while it does.
    Applying,
}

/// Drop the answer of the `nth` push (1-based; repeats of a push are not counted) of `rpc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropAnswer {
    /// `Rpc::Push` or `Rpc::DensePushPull`.
    pub rpc: Rpc,
    /// Which push, counting from 1.
    pub nth: u64,
    /// When the answer is dropped.
    pub when: When,
}

impl FromStr for DropAnswer {
    type Err = Refusal;

    /// `push:N` or `dense_push_pull:N`, optionally `:applied` (default) or `:applying`.
    fn from_str(s: &str) -> Result<Self, Refusal> {
        let bad = || {
            Refusal::Config(format!(
                "{s:?}: expected push:N or dense_push_pull:N, optionally :applied or :applying \
                 (N from 1)"
            ))
        };
        let mut parts = s.split(':');
        let rpc = match parts.next() {
            Some("push") => Rpc::Push,
            Some("dense_push_pull") => Rpc::DensePushPull,
            _ => return Err(bad()),
        };
        let nth = parts
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(bad)?;
        let when = match parts.next() {
            None | Some("applied") => When::Applied,
            Some("applying") => When::Applying,
            Some(_) => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self { rpc, nth, when })
    }
}

/// The rules of a shard (none by default) and how many pushes each has seen; clones share
/// the counts.
#[derive(Clone, Debug, Default)]
pub struct FaultHook {
    rules: Arc<Vec<(DropAnswer, AtomicU64)>>,
}

impl FaultHook {
    /// A hook dropping the answers `rules` name.
    pub fn new(rules: impl IntoIterator<Item = DropAnswer>) -> Self {
        Self {
            rules: Arc::new(rules.into_iter().map(|r| (r, AtomicU64::new(0))).collect()),
        }
    }

    /// Whether any rule is set.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Counts one push of `rpc` being applied; says when to drop its answer, if a rule says
    /// so.
    pub fn on_apply(&self, rpc: Rpc) -> Option<When> {
        let mut out = None;
        for (rule, seen) in self.rules.iter().filter(|(r, _)| r.rpc == rpc) {
            if seen.fetch_add(1, Relaxed) + 1 == rule.nth {
                out = out.or(Some(rule.when));
            }
        }
        out
    }
}

/// The status a dropped answer becomes: what a worker sees when the connection breaks.
pub fn dropped(rpc: Rpc) -> tonic::Status {
    tonic::Status::unavailable(format!(
        "test fault hook: the {rpc:?} answer was dropped as if the connection closed"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_fire_once_on_their_nth_push() {
        let r: DropAnswer = "dense_push_pull:2:applying".parse().unwrap();
        assert_eq!(
            r,
            DropAnswer {
                rpc: Rpc::DensePushPull,
                nth: 2,
                when: When::Applying
            }
        );
        let p: DropAnswer = "push:1".parse().unwrap();
        assert_eq!(p.when, When::Applied);
        for bad in [
            "pull:1",
            "push:0",
            "push",
            "push:1:later",
            "push:1:applied:x",
        ] {
            assert!(bad.parse::<DropAnswer>().is_err(), "{bad}");
        }
        let hook = FaultHook::new([r, p]);
        let copy = hook.clone();
        assert_eq!(hook.on_apply(Rpc::Push), Some(When::Applied));
        assert_eq!(hook.on_apply(Rpc::Push), None);
        assert_eq!(copy.on_apply(Rpc::DensePushPull), None);
        assert_eq!(hook.on_apply(Rpc::DensePushPull), Some(When::Applying));
        assert_eq!(copy.on_apply(Rpc::DensePushPull), None);
        assert!(FaultHook::default().is_empty());
    }
}

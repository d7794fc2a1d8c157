//! The role of one copy of a shard under failover (`--replicas R` with a coordinator):
//! primary, backup or deposed, at an epoch. Fencing by epoch: a copy refuses a worker whose
//! request names a newer epoch than its own (it was replaced: it deposes itself), a backup
//! refuses changes from a primary of an older epoch, and only the coordinator's order
//! (`Reconfigure`, at an epoch not below the copy's) changes a role.

use parking_lot::Mutex;
use sparta_proto::headers::NOT_PRIMARY;

use crate::error::Refusal;
use sparta_proto::pb::Role;

/// A copy's role and epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyRole {
    /// Raised by the coordinator at every change of the shard's copies.
    pub epoch: u64,
    /// What the copy does.
    pub role: Role,
}

/// What a [`RoleCell::change`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// A backup became the primary.
    Promoted,
    /// The same role at a newer epoch (a primary's backups changed).
    Renewed,
    /// The copy no longer serves.
    Deposed,
    /// Nothing changed (the order was repeated).
    Unchanged,
    /// The copy drops its state to receive a fresh copy of the primary.
    Joining,
    /// A joining copy caught up: a backup, eligible for promotion.
    Joined,
}

/// The role of one copy, changed under a lock.
#[derive(Debug)]
pub struct RoleCell(Mutex<CopyRole>);

impl RoleCell {
    /// A copy starting as `role` at epoch 1 (every shard's first configuration).
    pub fn new(role: Role) -> Self {
        Self(Mutex::new(CopyRole { epoch: 1, role }))
    }

    /// The current role.
    pub fn get(&self) -> CopyRole {
        *self.0.lock()
    }

    /// Checks a worker's request naming `epoch` (0: any) against this copy of `shard`: only
    /// a primary at that epoch or newer serves it. A newer epoch is refused without more:
    /// either another copy was promoted, or the coordinator's order for this one (its
    /// backups changed) has not arrived yet; the worker asks the coordinator and retries.
    pub fn serve(&self, shard: usize, epoch: u64) -> Result<(), Refusal> {
        let me = self.0.lock();
        match me.role {
            Role::Primary if epoch <= me.epoch => Ok(()),
            Role::Primary => Err(Refusal::Fenced(format!(
                "{NOT_PRIMARY} this copy of shard {shard} is the primary of epoch {}, the \
                 request names epoch {epoch}",
                me.epoch
            ))),
            Role::Backup => Err(Refusal::Fenced(format!(
                "{NOT_PRIMARY} this PS holds a backup copy of shard {shard} (epoch {})",
                me.epoch
            ))),
            Role::Deposed => Err(Refusal::Fenced(format!(
                "{NOT_PRIMARY} this copy of shard {shard} was deposed (epoch {})",
                me.epoch
            ))),
            Role::Joining => Err(Refusal::Fenced(format!(
                "{NOT_PRIMARY} this copy of shard {shard} is receiving its copy of the primary \
                 (epoch {})",
                me.epoch
            ))),
        }
    }

    /// Checks changes a primary of `epoch` sends to this backup copy of `shard`; a newer
    /// epoch is adopted (the coordinator renewed the primary first).
    pub fn accept_replica(&self, shard: usize, epoch: u64) -> Result<(), Refusal> {
        use crate::replicator::STALE_EPOCH;
        let mut me = self.0.lock();
        match me.role {
            Role::Backup | Role::Joining if epoch >= me.epoch => {
                me.epoch = epoch;
                Ok(())
            }
            Role::Backup | Role::Joining => Err(Refusal::Fenced(format!(
                "{STALE_EPOCH} this backup of shard {shard} is at epoch {}, the changes come \
                 from a primary of epoch {epoch}",
                me.epoch
            ))),
            Role::Primary => Err(Refusal::Fenced(format!(
                "{STALE_EPOCH} this copy of shard {shard} is its primary at epoch {}, the \
                 changes come from a primary of epoch {epoch}",
                me.epoch
            ))),
            Role::Deposed => Err(Refusal::Fenced(format!(
                "this copy of shard {shard} was deposed at epoch {}: it takes no changes",
                me.epoch
            ))),
        }
    }

    /// The coordinator's order: `role` at `epoch`. Refused below the copy's epoch, and for
    /// a way back into service (a deposed copy must be copied afresh: rejoin).
    pub fn change(&self, shard: usize, epoch: u64, role: Role) -> Result<Transition, Refusal> {
        let mut me = self.0.lock();
        if epoch < me.epoch {
            return Err(Refusal::Fenced(format!(
                "shard {shard}: an order for epoch {epoch}, this copy is at epoch {}",
                me.epoch
            )));
        }
        let t = match (me.role, role) {
            (a, b) if a == b && epoch == me.epoch => Transition::Unchanged,
            (Role::Backup, Role::Primary) => Transition::Promoted,
            (a, b) if a == b => Transition::Renewed,
            (_, Role::Joining) => Transition::Joining,
            (Role::Joining, Role::Backup) => Transition::Joined,
            (_, Role::Deposed) => Transition::Deposed,
            (from, to) => {
                return Err(Refusal::Fenced(format!(
                    "shard {shard}: this copy is {} and cannot become {} (a deposed copy \
                     rejoins by a fresh copy of the primary)",
                    from.as_str_name(),
                    to.as_str_name()
                )))
            }
        };
        *me = CopyRole { epoch, role };
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_primary_at_the_named_epoch_serves() {
        let p = RoleCell::new(Role::Primary);
        assert!(p.serve(0, 0).is_ok());
        assert!(p.serve(0, 1).is_ok());
        let e = p.serve(0, 2).unwrap_err().to_string();
        assert!(e.starts_with(NOT_PRIMARY) && e.contains("epoch 2"), "{e}");
        // Refused, not deposed: the coordinator's order may still be on its way.
        assert_eq!(p.get().role, Role::Primary);
        assert_eq!(p.change(0, 2, Role::Primary), Ok(Transition::Renewed));
        assert!(p.serve(0, 2).is_ok());
        assert_eq!(p.change(0, 3, Role::Deposed), Ok(Transition::Deposed));
        assert!(p.serve(0, 1).unwrap_err().to_string().contains("deposed"));
        let b = RoleCell::new(Role::Backup);
        assert!(b
            .serve(3, 0)
            .unwrap_err()
            .to_string()
            .contains("backup copy of shard 3"));
    }

    #[test]
    fn a_backup_refuses_changes_of_an_older_primary() {
        let b = RoleCell::new(Role::Backup);
        assert!(b.accept_replica(0, 1).is_ok());
        assert!(b.accept_replica(0, 3).is_ok());
        assert_eq!(b.get().epoch, 3);
        let e = b.accept_replica(0, 2).unwrap_err().to_string();
        assert!(e.starts_with(crate::replicator::STALE_EPOCH), "{e}");
        // Promoted at epoch 4: the old primary's changes are refused as stale.
        assert_eq!(b.change(0, 4, Role::Primary), Ok(Transition::Promoted));
        let e = b.accept_replica(0, 3).unwrap_err().to_string();
        assert!(e.starts_with(crate::replicator::STALE_EPOCH), "{e}");
    }

    #[test]
    fn orders_below_the_epoch_or_back_into_service_are_refused() {
        let c = RoleCell::new(Role::Primary);
        assert_eq!(c.change(0, 1, Role::Primary), Ok(Transition::Unchanged));
        assert_eq!(c.change(0, 2, Role::Primary), Ok(Transition::Renewed));
        assert!(c
            .change(0, 1, Role::Deposed)
            .unwrap_err()
            .to_string()
            .contains("epoch 1"));
        assert_eq!(c.change(0, 3, Role::Deposed), Ok(Transition::Deposed));
        let e = c.change(0, 4, Role::Primary).unwrap_err().to_string();
        assert!(e.contains("ROLE_DEPOSED") && e.contains("rejoin"), "{e}");
        // Rejoin: joining (serves nothing, takes changes), then a backup.
        assert_eq!(c.change(0, 4, Role::Joining), Ok(Transition::Joining));
        assert!(c
            .serve(0, 0)
            .unwrap_err()
            .to_string()
            .contains("receiving its copy"));
        assert!(c.accept_replica(0, 4).is_ok());
        assert!(
            c.change(0, 5, Role::Primary).is_err(),
            "not promoted while joining"
        );
        assert_eq!(c.change(0, 5, Role::Backup), Ok(Transition::Joined));
        let b = RoleCell::new(Role::Backup);
        assert!(b.change(0, 2, Role::Primary).is_ok());
        assert_eq!(
            b.get(),
            CopyRole {
                epoch: 2,
                role: Role::Primary
            }
        );
    }
}

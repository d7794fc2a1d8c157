//! What a resume does when a location holds no restorable checkpoint.
//!
//! `--resume` asks for a checkpoint: finding none is an error, so a mistyped path or a
//! deleted checkpoint never silently restarts a job from scratch. `--resume-if-present` (what
//! a restarting pod passes on its first start) starts fresh when the location holds no
//! checkpoint at all. Either way, a location whose checkpoints exist but none restores (a
//! deleted full base, corrupt files) is an error: training over it would lose the model.

use crate::error::{CheckpointError, Result};
use crate::manifest::list_checkpoints;
use crate::storage::Storage;

/// How a resume treats a location without a restorable checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumePolicy {
    /// A restorable checkpoint must exist (`--resume`).
    Required,
    /// Start fresh when the location holds no checkpoint at all (`--resume-if-present`).
    IfPresent,
}

/// Before opening a resume location (opening creates a missing local directory): `Ok(true)`
/// when `location` is a local directory that does not exist and `policy` allows a fresh start
/// (then there is nothing to open), `Ok(false)` when it exists or is not local, and an error
/// naming it when it is missing and a checkpoint is required.
pub fn missing_local_dir(location: &str, policy: ResumePolicy) -> Result<bool> {
    let crate::location::Location::Local(p) = crate::location::parse_location(location)? else {
        return Ok(false);
    };
    if p.exists() {
        return Ok(false);
    }
    match policy {
        ResumePolicy::Required => Err(CheckpointError::NothingToResume {
            location: p.display().to_string(),
            reason: "no such directory (pass --resume-if-present to start fresh when no \
                     checkpoint exists)"
                .into(),
        }),
        ResumePolicy::IfPresent => {
            tracing::info!(
                "no checkpoint directory {} yet: starting fresh (resume if present)",
                p.display()
            );
            Ok(true)
        }
    }
}

/// Called when no checkpoint of `storage` can be restored: `Ok(())` means start fresh (only
/// with [`ResumePolicy::IfPresent`] and no checkpoint written at all), otherwise the error
/// says why not.
pub fn nothing_to_resume(storage: &dyn Storage, policy: ResumePolicy) -> Result<()> {
    let location = storage.location();
    let (ids, committed) = list_checkpoints(storage)?;
    let committed = committed.len();
    if committed > 0 {
        return Err(CheckpointError::NothingToResume {
            location: location.clone(),
            reason: format!(
                "{committed} checkpoint(s) were written there but none can be restored (a \
                 deleted full base, a corrupt or missing file); `sparta checkpoint inspect \
                 {location}` says which file is wrong. Refusing to start fresh over them"
            ),
        });
    }
    match policy {
        ResumePolicy::IfPresent => {
            tracing::info!(
                "no checkpoint in {location}{}: starting fresh (resume if present)",
                if ids.is_empty() {
                    String::new()
                } else {
                    format!(" ({} incomplete one(s) ignored)", ids.len())
                }
            );
            Ok(())
        }
        ResumePolicy::Required => Err(CheckpointError::NothingToResume {
            location,
            reason: if ids.is_empty() {
                "it holds no checkpoint (a wrong path? pass --resume-if-present to start fresh \
                 when none exists)"
                    .into()
            } else {
                format!(
                    "it holds only {} incomplete checkpoint(s), none committed (pass \
                     --resume-if-present to start fresh when none exists)",
                    ids.len()
                )
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::MANIFEST_FILE;
    use crate::storage::LocalDir;

    #[test]
    fn an_empty_location_is_an_error_unless_resuming_if_present() {
        let d = tempfile::tempdir().unwrap();
        let s = LocalDir::new(d.path()).unwrap();
        let e = nothing_to_resume(&s, ResumePolicy::Required).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("holds no checkpoint"), "{msg}");
        assert!(msg.contains("--resume-if-present"), "{msg}");
        nothing_to_resume(&s, ResumePolicy::IfPresent).unwrap();
        // An incomplete checkpoint (no manifest) is still nothing to resume.
        s.put("ckpt-0000000000000001/dense.dense.bin", b"x")
            .unwrap();
        let msg = nothing_to_resume(&s, ResumePolicy::Required)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("1 incomplete"), "{msg}");
        nothing_to_resume(&s, ResumePolicy::IfPresent).unwrap();
    }

    #[test]
    fn a_missing_local_directory_is_an_error_unless_resuming_if_present() {
        let d = tempfile::tempdir().unwrap();
        let gone = d.path().join("typo");
        let loc = gone.to_str().unwrap();
        let msg = missing_local_dir(loc, ResumePolicy::Required)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("no such directory") && msg.contains(loc),
            "{msg}"
        );
        assert!(missing_local_dir(loc, ResumePolicy::IfPresent).unwrap());
        assert!(!missing_local_dir(d.path().to_str().unwrap(), ResumePolicy::Required).unwrap());
        assert!(!gone.exists());
    }

    #[test]
    fn written_but_unrestorable_checkpoints_are_always_an_error() {
        let d = tempfile::tempdir().unwrap();
        let s = LocalDir::new(d.path()).unwrap();
        s.put(&format!("ckpt-0000000000000002/{MANIFEST_FILE}"), b"{}")
            .unwrap();
        for policy in [ResumePolicy::Required, ResumePolicy::IfPresent] {
            let msg = nothing_to_resume(&s, policy).unwrap_err().to_string();
            assert!(msg.contains("none can be restored"), "{msg}");
            assert!(msg.contains("checkpoint inspect"), "{msg}");
        }
    }
}

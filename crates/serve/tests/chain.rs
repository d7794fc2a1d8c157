//! The chain rules: a gap or a corrupt version is reported (stale, counted once) and skipped,
//! the next full export that verifies recovers; a step going back is accepted only from a new
//! trainer lineage; a handle starts before the first export.

mod common;

use common::{assert_matches, Live};
use sparta_serve::format::version_dir;
use sparta_serve::{ExportKind, ExportOptions, Exporter, ModelHandle, PollOutcome, Snapshot};

fn opts(full_every: u32) -> ExportOptions {
    ExportOptions {
        sync: false,
        full_every,
        keep_full: 10,
        ..ExportOptions::default()
    }
}

fn keys(from: u64, n: u64) -> Vec<u64> {
    (from..from + n)
        .map(|i| ((i % 26) << 56) | (i * 7919 + 1))
        .collect()
}

/// Changes some rows and exports; returns the version written.
fn step(ex: &mut Exporter, live: &mut Live, round: u64, step: u64) -> (u64, ExportKind) {
    live.touch(&keys(round * 37, 60));
    let info = ex
        .export(&live.text, &live.model, &live.tables(), step)
        .unwrap();
    (info.version, info.kind)
}

fn flip_a_byte(dir: &std::path::Path, v: u64) {
    let rows = dir.join(version_dir(v)).join("table-embedding.rows");
    let mut b = std::fs::read(&rows).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x40;
    std::fs::write(&rows, &b).unwrap();
}

/// A server that finds its chain broken asks the trainer for a full export; this "trainer"
/// ignores the request, so recovery waits for the next full export it writes on its own.
fn ignore_the_full_request(dir: &std::path::Path) {
    let request = dir.join(sparta_export::FULL_REQUEST_FILE);
    assert!(request.exists(), "the server asks for a full export");
    std::fs::remove_file(request).unwrap();
}

#[test]
fn a_gap_is_reported_once_and_the_next_full_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("wdl", "");
    let mut ex = Exporter::open(dir.path(), opts(100)).unwrap();
    for r in 0..5 {
        step(&mut ex, &mut live, r, 10 * (r + 1));
    }
    std::fs::remove_dir_all(dir.path().join(version_dir(3))).unwrap();

    // A fresh start serves the newest consistent chain (1, 2) and says why not 4 and 5.
    let (snap, found) = Snapshot::load_latest_checked(dir.path()).unwrap();
    assert_eq!(snap.version(), 2);
    let st = found.stale().expect("stale").clone();
    assert_eq!((st.since_version, st.newest_on_disk), (2, 5));
    assert!(st.reason.contains("delta 4 applies on version 3"), "{st:?}");

    let handle = ModelHandle::open(dir.path()).unwrap();
    assert_eq!(handle.current().unwrap().version(), 2);
    let status = handle.status();
    assert_eq!(status.stale.as_ref().unwrap().since_version, 2);
    assert_eq!(status.newest_on_disk, 5);
    assert!(status.bad_versions.is_empty());
    let c = handle.counters();
    assert_eq!(c.chain.chain_breaks.get(), 1);
    ignore_the_full_request(dir.path());
    // Later polls change nothing and count nothing again.
    for _ in 0..3 {
        assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    }
    assert_eq!(c.chain.chain_breaks.get(), 1);
    assert_eq!(handle.reload_errors(), 0);
    // More deltas of the broken chain: still stale, still one break.
    step(&mut ex, &mut live, 9, 60);
    assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    assert_eq!(handle.status().stale.unwrap().newest_on_disk, 6);
    assert_eq!(c.chain.chain_breaks.get(), 1);

    // The next full export (a new exporter: its first version is full) recovers, and its
    // deltas follow.
    let mut ex2 = Exporter::open(dir.path(), opts(100)).unwrap();
    let (v, kind) = step(&mut ex2, &mut live, 10, 70);
    assert_eq!((v, kind), (7, ExportKind::Full));
    assert_eq!(handle.poll().unwrap(), PollOutcome::Reloaded(7));
    assert!(handle.status().stale.is_none());
    assert_matches(&handle.current().unwrap(), &live);
    let (v, _) = step(&mut ex2, &mut live, 11, 80);
    assert_eq!(handle.poll().unwrap(), PollOutcome::Applied(v));
    assert_matches(&handle.current().unwrap(), &live);
    assert!(handle.status().stale.is_none());
    assert_eq!(c.chain.chain_breaks.get(), 1);
    assert_eq!(c.chain.lineage_changes.get(), 0, "the step never went back");
}

#[test]
fn a_corrupt_delta_is_skipped_once_and_a_later_full_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("deepfm", "");
    // A full export after every 3 deltas: v1 full, v2-v4 deltas, v5 full.
    let mut ex = Exporter::open(dir.path(), opts(3)).unwrap();
    step(&mut ex, &mut live, 0, 1);
    step(&mut ex, &mut live, 1, 2);
    let handle = ModelHandle::open(dir.path()).unwrap();
    assert_eq!(handle.current().unwrap().version(), 2);

    let (v3, _) = step(&mut ex, &mut live, 2, 3);
    flip_a_byte(dir.path(), v3);
    let (v4, kind) = step(&mut ex, &mut live, 3, 4);
    assert_eq!((v4, kind), (4, ExportKind::Delta));
    for _ in 0..3 {
        // Never an error, and version 3 is read (and counted) once.
        assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    }
    let status = handle.status();
    assert_eq!(status.bad_versions, [3]);
    let stale = status.stale.unwrap();
    assert_eq!((stale.since_version, stale.newest_on_disk), (2, 4));
    assert!(
        stale.reason.contains("version 3 failed verification"),
        "{stale:?}"
    );
    let c = handle.counters();
    assert_eq!(c.chain.bad_versions.get(), 1);
    assert_eq!(c.chain.chain_breaks.get(), 1);
    assert_eq!(handle.reload_errors(), 0);

    // Predict on the same directory: the chain up to 2, and the bad version named.
    let (snap, found) = Snapshot::load_latest_checked(dir.path()).unwrap();
    assert_eq!(snap.version(), 2);
    assert!(found.bad_versions().contains_key(&3));
    assert!(found.stale().is_some());

    let (v5, kind) = step(&mut ex, &mut live, 4, 5);
    assert_eq!((v5, kind), (5, ExportKind::Full));
    assert_eq!(handle.poll().unwrap(), PollOutcome::Reloaded(5));
    assert!(handle.status().stale.is_none());
    assert_matches(&handle.current().unwrap(), &live);
    assert_eq!(c.chain.bad_versions.get(), 1);
}

#[test]
fn a_step_goes_back_only_with_a_new_lineage() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("wdl", "");
    let mut a = Exporter::open(dir.path(), opts(100)).unwrap();
    step(&mut a, &mut live, 0, 10);
    step(&mut a, &mut live, 1, 20);
    let handle = ModelHandle::open(dir.path()).unwrap();
    let snap = handle.current().unwrap();
    assert_eq!((snap.step(), snap.lineage()), (20, a.lineage()));

    // The trainer restarts from an older checkpoint: a new lineage, a lower step. Accepted,
    // and said so.
    let mut b = Exporter::open(dir.path(), opts(100)).unwrap();
    assert_ne!(a.lineage(), b.lineage());
    let (v3, _) = step(&mut b, &mut live, 2, 15);
    assert_eq!(handle.poll().unwrap(), PollOutcome::Reloaded(v3));
    let snap = handle.current().unwrap();
    assert_eq!((snap.step(), snap.lineage()), (15, b.lineage()));
    let back = handle.status().step_went_back.unwrap();
    assert_eq!((back.version, back.from_step, back.to_step), (3, 20, 15));
    assert_eq!(back.to_lineage, format!("{:016x}", b.lineage()));
    assert_eq!(handle.counters().chain.lineage_changes.get(), 1);
    assert!(handle.status().stale.is_none());
    assert_matches(&snap, &live);
    // `GET /v1/model` shows the lineage and the step going back.
    let doc = sparta_serve::server::model_json(Some(&snap), &handle);
    assert_eq!(doc["lineage"], format!("{:016x}", b.lineage()));
    assert_eq!(doc["step_went_back"]["from_step"], 20);
    assert_eq!(doc["step_went_back"]["to_step"], 15);
    assert_eq!(doc["status"], "ok");

    // The same lineage going back in steps is a bad version: skipped, counted, stale.
    let (v4, kind) = step(&mut b, &mut live, 3, 12);
    assert_eq!(kind, ExportKind::Delta);
    assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    assert_eq!(handle.current().unwrap().version(), v3);
    let status = handle.status();
    assert_eq!(status.bad_versions, [v4]);
    let stale = status.stale.unwrap();
    assert!(stale.reason.contains("same trainer lineage"), "{stale:?}");
    assert_eq!(handle.counters().chain.bad_versions.get(), 1);
    assert_eq!(handle.counters().chain.lineage_changes.get(), 1);
}

#[test]
fn a_handle_starts_before_the_first_export() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("export");
    let handle = ModelHandle::open(&dir).unwrap();
    assert!(handle.current().is_none());
    assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    assert!(handle.status().stale.is_none());
    assert!(
        !dir.exists(),
        "the server does not create the export directory"
    );
    let e = Snapshot::load_latest(&dir).unwrap_err().to_string();
    assert!(e.contains("no valid export"), "{e}");

    let mut live = Live::new("wdl", "");
    let mut ex = Exporter::open(&dir, opts(100)).unwrap();
    step(&mut ex, &mut live, 0, 1);
    assert_eq!(handle.poll().unwrap(), PollOutcome::Reloaded(1));
    assert_matches(&handle.current().unwrap(), &live);
    let (v, _) = step(&mut ex, &mut live, 1, 2);
    assert_eq!(handle.poll().unwrap(), PollOutcome::Applied(v));
    assert_matches(&handle.current().unwrap(), &live);
    assert_eq!(handle.reloads(), 2);
}

#[test]
fn a_corrupt_first_full_waits_for_the_next_one() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("export");
    let mut live = Live::new("wdl", "");
    let mut ex = Exporter::open(&dir, opts(1)).unwrap();
    step(&mut ex, &mut live, 0, 1);
    flip_a_byte(&dir, 1);
    let handle = ModelHandle::open(&dir).unwrap();
    assert!(handle.current().is_none());
    let st = handle.status();
    assert_eq!(st.bad_versions, [1]);
    assert_eq!(st.stale.unwrap().since_version, 0);
    ignore_the_full_request(&dir);
    step(&mut ex, &mut live, 1, 2); // a delta on the bad full: unreachable
    assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    assert!(handle.current().is_none());
    let (v3, kind) = step(&mut ex, &mut live, 2, 3);
    assert_eq!((v3, kind), (3, ExportKind::Full));
    assert_eq!(handle.poll().unwrap(), PollOutcome::Reloaded(3));
    assert_matches(&handle.current().unwrap(), &live);
    assert!(handle.status().stale.is_none());
}

#[test]
fn a_full_export_going_back_in_the_same_lineage_is_bad() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::new("wdl", "");
    // full_every 1: v1 full, v2 delta, v3 full, v4 delta.
    let mut ex = Exporter::open(dir.path(), opts(1)).unwrap();
    step(&mut ex, &mut live, 0, 10);
    step(&mut ex, &mut live, 1, 20);
    let handle = ModelHandle::open(dir.path()).unwrap();
    assert_eq!(handle.current().unwrap().step(), 20);
    let (v3, kind) = step(&mut ex, &mut live, 2, 5);
    assert_eq!(kind, ExportKind::Full);
    assert_eq!(handle.poll().unwrap(), PollOutcome::Unchanged);
    let st = handle.status();
    assert_eq!(st.bad_versions, [v3]);
    assert!(st.step_went_back.is_none());
    assert_eq!(handle.current().unwrap().version(), 2);
    assert_eq!(handle.counters().chain.lineage_changes.get(), 0);
}

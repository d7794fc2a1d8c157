//! Readers scoring while deltas are installed never see a half-applied version: every answer
//! equals, bit for bit, the answer of a fresh load of the version it reports.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{batch_of, lines, Live};
use sparta_serve::{ExportOptions, Exporter, ModelHandle, PollOutcome, Snapshot};

#[test]
fn readers_never_see_a_mixed_version() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, ids) = batch_of(&lines(64, 11));
    let mut live = Live::new("wdl", "");
    live.touch(&ids);
    let mut ex = Exporter::open(
        dir.path(),
        ExportOptions {
            sync: false,
            ..ExportOptions::default()
        },
    )
    .unwrap();
    ex.export(&live.text, &live.model, &live.tables(), 0)
        .unwrap();
    let handle = Arc::new(ModelHandle::open(dir.path()).unwrap());

    // Expected answer of every version, from a fresh load right after its export.
    let mut expected: HashMap<u64, Vec<u32>> = HashMap::new();
    let bits = |p: Vec<f32>| p.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    expected.insert(
        1,
        bits(
            Snapshot::load_latest(dir.path())
                .unwrap()
                .predict(batch.clone()),
        ),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (h, stop, batch) = (Arc::clone(&handle), Arc::clone(&stop), batch.clone());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let snap = h.current().unwrap();
                    let p = snap.predict(batch.clone());
                    seen.push((
                        snap.version(),
                        p.into_iter().map(f32::to_bits).collect::<Vec<_>>(),
                    ));
                }
                seen
            })
        })
        .collect();

    // Each delta changes half of the batch's ids, so a mix of two versions gives a third answer.
    for round in 0..12 {
        let half: Vec<u64> = ids.iter().copied().skip(round % 2).step_by(2).collect();
        live.touch(&half);
        let info = ex
            .export(&live.text, &live.model, &live.tables(), round as u64)
            .unwrap();
        expected.insert(
            info.version,
            bits(
                Snapshot::load_latest(dir.path())
                    .unwrap()
                    .predict(batch.clone()),
            ),
        );
        assert_eq!(handle.poll().unwrap(), PollOutcome::Applied(info.version));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let mut versions_seen = std::collections::BTreeSet::new();
    for r in readers {
        for (v, p) in r.join().unwrap() {
            let want = expected
                .get(&v)
                .unwrap_or_else(|| panic!("unknown version {v}"));
            assert_eq!(
                &p, want,
                "answer of version {v} differs from that version's own"
            );
            versions_seen.insert(v);
        }
    }
    assert!(
        versions_seen.len() > 1,
        "readers saw only {versions_seen:?}"
    );
    // All answers differ between versions (the check above could not pass by accident).
    let distinct: std::collections::HashSet<_> = expected.values().collect();
    assert_eq!(distinct.len(), expected.len());
}

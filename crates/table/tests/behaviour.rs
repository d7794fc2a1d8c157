//! Concurrency, admission, eviction at scale, deltas, stats and config.
use std::sync::Arc;

use sparta_table::{Admission, Eviction, Initializer, Optimizer, Table, TableConfig, TableError};

fn cfg(dim: usize) -> TableConfig {
    TableConfig {
        dim,
        optimizer: Optimizer::Sgd { lr: 1.0 },
        init: Initializer::Constant { value: 100.0 },
        ..TableConfig::default()
    }
}

/// Semantics: the shard lock makes each push of one key atomic, so concurrent pushes to the
/// same keys never lose updates. With SGD lr = 1 and gradients of 1.0 the final weight is
/// `init - total pushes of that key`.
#[test]
fn concurrent_pushes_to_overlapping_keys_lose_no_update() {
    let t = Arc::new(
        Table::new(TableConfig {
            shards: 8,
            ..cfg(4)
        })
        .unwrap(),
    );
    let keys: Vec<u64> = (0..200u64).map(|k| k << 50 | k).collect();
    let mut out = vec![0.0; keys.len() * 4];
    t.pull(&keys, &mut out);
    let threads = 8;
    let rounds = 50;
    std::thread::scope(|s| {
        for th in 0..threads {
            let t = t.clone();
            let keys = keys.clone();
            s.spawn(move || {
                for r in 0..rounds {
                    // Every thread pushes an overlapping, rotated window (half of all keys).
                    let start = (th * 13 + r * 7) % keys.len();
                    let batch: Vec<u64> =
                        (0..100).map(|i| keys[(start + i) % keys.len()]).collect();
                    let grads = vec![1.0; batch.len() * 4];
                    t.push(&batch, &grads);
                    let mut o = vec![0.0; batch.len() * 4];
                    t.pull(&batch, &mut o);
                }
            });
        }
    });
    let mut expected = vec![0u32; keys.len()];
    for th in 0..threads {
        for r in 0..rounds {
            let start = (th * 13 + r * 7) % keys.len();
            for i in 0..100 {
                expected[(start + i) % keys.len()] += 1;
            }
        }
    }
    t.pull_readonly(&keys, &mut out);
    for (i, e) in expected.iter().enumerate() {
        for d in 0..4 {
            assert_eq!(out[i * 4 + d], 100.0 - *e as f32, "key {i}");
        }
    }
    assert_eq!(t.version(), (threads * rounds) as u64);
}

#[test]
fn count_admission_admits_on_nth_sighting() {
    let t = Table::new(TableConfig {
        admission: Admission::Count { min_count: 3 },
        ..cfg(2)
    })
    .unwrap();
    let mut out = [0.0; 2];
    for sighting in 1..=3 {
        t.pull(&[42], &mut out);
        assert_eq!(t.contains(42), sighting == 3);
        assert_eq!(out, if sighting == 3 { [100.0; 2] } else { [0.0; 2] });
        t.push(&[42], &[1.0, 1.0]);
    }
    let st = t.stats();
    assert_eq!(
        (st.admitted, st.rejected, st.dropped_pushes, st.rows),
        (1, 2, 2, 1)
    );
}

#[test]
fn probability_admission_is_deterministic_and_near_p() {
    let mk = || {
        Table::new(TableConfig {
            admission: Admission::Probability { p: 0.25 },
            seed: 3,
            ..cfg(1)
        })
        .unwrap()
    };
    let (a, b) = (mk(), mk());
    let keys: Vec<u64> = (0..20_000u64).collect();
    let mut out = vec![0.0; keys.len()];
    a.pull(&keys, &mut out);
    b.pull(&keys, &mut out);
    let rate = a.len() as f64 / keys.len() as f64;
    assert!((0.23..0.27).contains(&rate), "admit rate {rate}");
    assert_eq!(a.len(), b.len());
    assert!(keys.iter().all(|&k| a.contains(k) == b.contains(k)));
    // Later sightings get fresh chances.
    a.pull(&keys, &mut out);
    assert!(a.len() as f64 / keys.len() as f64 > 0.4);
    let never = Table::new(TableConfig {
        admission: Admission::Probability { p: 0.0 },
        ..cfg(1)
    })
    .unwrap();
    never.pull(&keys, &mut out);
    assert!(never.is_empty());
}

#[test]
fn eviction_is_incremental_and_slots_are_reused() {
    let t = Table::new(TableConfig {
        shards: 4,
        eviction: Some(Eviction {
            max_idle_steps: Some(1),
            min_count: None,
            max_idle_seconds: None,
        }),
        ..cfg(8)
    })
    .unwrap();
    let old: Vec<u64> = (0..50_000u64)
        .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let mut out = vec![0.0; old.len() * 8];
    t.pull(&old, &mut out);
    let slots_after_fill = t.stats().slab_slots;
    t.advance_step();
    t.advance_step();
    let fresh: Vec<u64> = (1..=1000u64).map(|k| !k).collect();
    let mut out2 = vec![0.0; fresh.len() * 8];
    t.pull(&fresh, &mut out2);
    let mut total = 0;
    let mut calls = 0;
    loop {
        let st = t.evict(4096);
        assert!(st.scanned <= 4096);
        total += st.evicted;
        calls += 1;
        if st.wrapped {
            break;
        }
    }
    assert!(calls > 10, "eviction must be incremental");
    assert_eq!(total, old.len());
    assert_eq!(t.len(), fresh.len());
    assert!(fresh.iter().all(|&k| t.contains(k)) && !old.iter().any(|&k| t.contains(k)));
    // Freed slots are reused: refilling does not grow the slabs.
    t.pull(&old, &mut out);
    assert_eq!(t.stats().slab_slots, slots_after_fill + fresh.len());
    assert!(out.iter().all(|&v| v == 100.0));
    let d = t.changed_since(0);
    assert_eq!(d.removed.len(), old.len());
    assert_eq!(t.stats().evicted, old.len() as u64);
}

#[test]
fn min_count_eviction_removes_rare_rows() {
    let t = Table::new(TableConfig {
        eviction: Some(Eviction {
            max_idle_steps: None,
            min_count: Some(3),
            max_idle_seconds: None,
        }),
        ..cfg(1)
    })
    .unwrap();
    let mut o = [0.0; 1];
    for _ in 0..3 {
        t.pull(&[1], &mut o);
    }
    t.pull(&[2], &mut o);
    let st = t.evict(1 << 20);
    assert_eq!(st.evicted, 1);
    assert!(t.contains(1) && !t.contains(2));
}

#[test]
fn large_fill_remove_keeps_index_consistent() {
    let t = Table::new(TableConfig {
        shards: 2,
        ..cfg(1)
    })
    .unwrap();
    let keys: Vec<u64> = (0..200_000u64).map(|k| (k % 7) << 56 | k).collect();
    let mut out = vec![0.0; keys.len()];
    t.pull(&keys, &mut out);
    assert_eq!(t.len(), keys.len());
    for &k in keys.iter().step_by(3) {
        assert!(t.remove(k));
    }
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(t.contains(k), i % 3 != 0, "key {k}");
    }
    let st = t.stats();
    assert!(st.bytes_per_row > 0.0 && st.bytes >= st.rows * st.payload_bytes_per_row);
}

#[test]
fn changed_since_reports_pushed_rows_only() {
    let t = Table::new(cfg(2)).unwrap();
    let mut out = vec![0.0; 6];
    t.pull(&[1, 2, 3], &mut out);
    let v0 = t.version();
    assert_eq!(
        t.changed_since(v0).keys.len(),
        3,
        "creation after v0 is a change"
    );
    t.push(&[1, 2, 3], &[0.0; 6]);
    let v1 = t.version();
    t.push(&[2], &[1.0, 1.0]);
    let d = t.changed_since(v1);
    assert_eq!(d.keys, vec![2]);
    assert_eq!(d.rows, vec![99.0, 99.0]);
    assert_eq!(d.version, v1 + 1);
    assert!(t.changed_since(d.version).keys.is_empty());
    assert_eq!(t.bump_version(), d.version + 1);
}

#[test]
fn config_validation_and_serde() {
    assert!(matches!(
        Table::new(TableConfig { dim: 0, ..cfg(1) }),
        Err(TableError::InvalidConfig { .. })
    ));
    let bad = TableConfig {
        optimizer: Optimizer::Adam {
            lr: 0.1,
            beta1: 1.5,
            beta2: 0.9,
            eps: 1e-8,
        },
        ..cfg(1)
    };
    assert!(bad.validate().is_err());
    let json = r#"{"name":"ads","dim":8,"optimizer":{"type":"row_wise_adagrad","lr":0.1,"initial_accumulator":0.1,"eps":1e-8},
        "admission":{"type":"count","min_count":2},"eviction":{"max_idle_steps":100}}"#;
    let c: TableConfig = serde_json::from_str(json).unwrap();
    assert_eq!(c.dim, 8);
    assert_eq!(c.eviction.as_ref().unwrap().max_idle_steps, Some(100));
    let t = Table::new(c).unwrap();
    assert_eq!(t.row_stride(), 9);
    assert!(serde_json::from_str::<TableConfig>(r#"{"dimm":8}"#).is_err());
    let s = serde_json::to_string(&t.stats()).unwrap();
    assert!(s.contains("bytes_per_row"));
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Table>();
}

#[test]
fn concurrent_creation_never_duplicates_rows() {
    let t = Arc::new(
        Table::new(TableConfig {
            shards: 4,
            ..cfg(2)
        })
        .unwrap(),
    );
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let t = t.clone();
            s.spawn(move || {
                // Overlapping ranges: every key in 0..30_000 is created by 2 threads at once.
                let keys: Vec<u64> = (th * 10_000..th * 10_000 + 20_000)
                    .map(|k| (k % 30_000) << 20)
                    .collect();
                let mut out = vec![0.0; keys.len() * 2];
                for chunk in keys.chunks(1000) {
                    t.pull(chunk, &mut out[..chunk.len() * 2]);
                }
            });
        }
    });
    assert_eq!(t.len(), 30_000);
    assert_eq!(t.stats().admitted, 30_000);
}

#[test]
fn eviction_after_zero_idle_steps_is_refused() {
    let zero = TableConfig {
        eviction: Some(Eviction {
            max_idle_steps: Some(0),
            min_count: None,
            max_idle_seconds: None,
        }),
        ..cfg(1)
    };
    let e = zero.validate().unwrap_err().to_string();
    assert!(e.contains("max_idle_steps = 0"), "{e}");
}

#[test]
fn set_optimizer_takes_new_hyper_parameters_of_the_same_kind_only() {
    let mut t = Table::new(cfg(2)).unwrap();
    t.pull(&[7], &mut [0.0; 2]);
    t.push(&[7], &[1.0, 1.0]);
    // Same kind, another lr: the row stays, later pushes use the new lr.
    t.set_optimizer(Optimizer::Sgd { lr: 10.0 }).unwrap();
    t.push(&[7], &[1.0, 1.0]);
    let mut row = [0.0; 2];
    t.pull_readonly(&[7], &mut row);
    assert_eq!(row, [100.0 - 1.0 - 10.0; 2]);
    // Another kind (other state per row) and out-of-range values are refused.
    let adam = Optimizer::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    let e = t.set_optimizer(adam).unwrap_err().to_string();
    assert!(e.contains("cannot continue"), "{e}");
    assert!(t.set_optimizer(Optimizer::Sgd { lr: f32::NAN }).is_err());
    assert_eq!(t.config().optimizer, Optimizer::Sgd { lr: 10.0 });
}

/// `push_at` with the slots `pull_keeping` found gives what `push` gives, whatever happened
/// to the rows in between: rows removed (pushes to them dropped), their slots reused by other
/// keys, rows created for keys that were not admitted at the pull, and hints that are stale,
/// foreign or out of range.
#[test]
fn push_at_with_kept_slots_is_push_whatever_the_rows_did_in_between() {
    let config = || TableConfig {
        shards: 4,
        dim: 16,
        optimizer: Optimizer::Adagrad {
            lr: 0.05,
            initial_accumulator: 0.1,
            eps: 1e-8,
        },
        init: Initializer::Uniform {
            low: -0.5,
            high: 0.5,
        },
        admission: Admission::Count { min_count: 2 },
        ..TableConfig::default()
    };
    let (plain, hinted) = (Table::new(config()).unwrap(), Table::new(config()).unwrap());
    let key = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let keys: Vec<u64> = (0..3000).map(key).collect();
    // Seen once before: admitted by the next pull. The last third is not: no row, NO_SLOT.
    let mut out = vec![0.0; keys.len() * 16];
    for t in [&plain, &hinted] {
        t.pull(&keys[..2000], &mut out[..2000 * 16]);
    }
    let mut slots = vec![0u32; keys.len()];
    plain.pull(&keys, &mut out);
    hinted.pull_keeping(&keys, &mut out, &mut slots);
    assert!(slots[..2000].iter().all(|&s| s != u32::MAX));
    assert!(slots[2000..].iter().all(|&s| s == u32::MAX));
    // In between: rows removed, others created in their slots, the unadmitted ones admitted.
    for t in [&plain, &hinted] {
        for &k in keys.iter().step_by(7) {
            t.remove(k);
        }
        let others: Vec<u64> = (10_000..10_400).map(key).collect();
        let mut o = vec![0.0; others.len() * 16];
        t.pull(&others, &mut o);
        t.pull(&others, &mut o);
        t.pull(&keys[2500..], &mut out[2500 * 16..]);
    }
    // Stale, foreign and out-of-range hints among the kept ones.
    slots[1] = slots[2];
    slots[3] = u32::MAX - 1;
    slots[5] = 0;
    let grads: Vec<f32> = (0..keys.len() * 16)
        .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
        .collect();
    for round in 0..2 {
        plain.push(&keys, &grads);
        hinted.push_at(&keys, &grads, &slots);
        let (mut a, mut b) = (vec![0.0; keys.len() * 16], vec![0.0; keys.len() * 16]);
        plain.pull_readonly(&keys, &mut a);
        hinted.pull_readonly(&keys, &mut b);
        let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "round {round}: rows differ");
        assert_eq!(plain.stats().dropped_pushes, hinted.stats().dropped_pushes);
        assert_eq!(plain.len(), hinted.len());
    }
    assert!(plain.stats().dropped_pushes > 0);
}

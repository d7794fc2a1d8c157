//! The engine with a fake topic: multi-partition batches carry the exact offsets of every
//! partition, and a stream restarted at any batch's position continues without a gap or a
//! repeat.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::schema::{Column, ColumnKind, Schema};
use std::sync::atomic::Ordering::Relaxed;

/// Label and one sparse column: record `(p, o)` is the line `"{o%2}\tp{p}o{o}"`.
fn schema() -> Schema {
    Schema {
        columns: vec![
            Column::new("label", ColumnKind::Label),
            Column::new("rec", ColumnKind::Sparse),
        ],
        separator: '\t',
        header: false,
    }
}

fn line(p: i32, o: i64) -> Vec<u8> {
    format!("{}\tp{p}o{o}", o % 2).into_bytes()
}

/// Partition -> its records (offset = index); record 5 of partition 1 holds a newline and
/// record 7 of partition 0 is empty: neither is a row, both must pass with the offsets.
fn topic() -> BTreeMap<i32, Vec<Option<Vec<u8>>>> {
    let mut t = BTreeMap::new();
    for (p, n) in [(0, 40i64), (1, 23), (2, 0), (3, 31)] {
        let mut recs: Vec<_> = (0..n).map(|o| Some(line(p, o))).collect();
        if p == 1 {
            recs[5] = Some(b"1\tbad\n0\tline\n".to_vec());
        }
        if p == 0 {
            recs[7] = None;
        }
        t.insert(p, recs);
    }
    t
}

/// A broker of `topic` read from `start`: fetches of 1..=5 records, partitions in turn, an
/// empty poll now and then (a quiet topic), closed at the end.
fn fake_source(start: &[(i32, i64)]) -> impl FnMut(Duration) -> Poll + Send + 'static {
    let topic = topic();
    let mut at: BTreeMap<i32, i64> = start.iter().copied().collect();
    let mut turn = 0usize;
    move |_wait| {
        turn += 1;
        if turn % 7 == 0 {
            return Poll::Empty;
        }
        let open: Vec<i32> = topic
            .iter()
            .filter(|(p, r)| at[*p] < r.len() as i64)
            .map(|(p, _)| *p)
            .collect();
        let Some(&p) = open.get(turn % open.len().max(1)) else {
            return Poll::Closed;
        };
        let from = at[&p];
        let to = (from + 1 + (turn % 5) as i64).min(topic[&p].len() as i64);
        at.insert(p, to);
        let records = (from..to)
            .map(|o| (o, topic[&p][o as usize].clone().map(bytes::Bytes::from)))
            .collect();
        Poll::Ready(Fetched::Records {
            partition: p,
            records,
            next: to,
        })
    }
}

fn reader() -> ReaderConfig {
    let mut r = ReaderConfig::new(schema());
    r.batch_size = 8;
    r.threads = 3;
    r.queue_batches = 4;
    r.max_bad_line_ratio = 0.5;
    r
}

/// Id -> (partition, offset) of every row of the topic.
fn ids() -> HashMap<u64, (i32, i64)> {
    let parser = crate::parse::LineParser::for_plan(&schema(), None);
    let mut out = HashMap::new();
    for (p, recs) in topic() {
        for (o, r) in recs.iter().enumerate() {
            let mut b = parser.builder(1);
            if r.as_deref()
                .is_some_and(|l| parser.parse_line(l, &mut b).is_ok())
            {
                out.insert(b.take().ids[0], (p, o as i64));
            }
        }
    }
    out
}

/// Runs a stream from `start` to its end: every batch's records and position.
fn run(start: KafkaPosition) -> Vec<(Vec<(i32, i64)>, KafkaPosition)> {
    let mut cfg = KafkaConfig::new(vec!["fake:9092".into()], "t");
    cfg.linger = Duration::from_millis(1);
    let source = fake_source(&start.offsets);
    let stream = start_stream(&cfg, &reader(), start, move |feeder, file, ends| {
        pump::pump(feeder, file, Duration::from_millis(1), source, ends)
    })
    .unwrap();
    let ids = ids();
    stream
        .map(|b| {
            let b = b.unwrap();
            let recs = b.batch.ids.iter().map(|id| ids[id]).collect();
            (recs, b.position)
        })
        .collect()
}

fn start() -> KafkaPosition {
    KafkaPosition {
        topic: "t".into(),
        offsets: vec![(0, 0), (1, 0), (2, 0), (3, 0)],
        rows: 0,
    }
}

#[test]
fn every_batch_carries_the_next_offset_of_every_partition() {
    let batches = run(start());
    let rows: usize = batches.iter().map(|(r, _)| r.len()).sum();
    assert_eq!(
        rows,
        40 + 23 + 31 - 2,
        "every row once (two records are no rows)"
    );
    // Per partition: the offsets of its rows (the records that are rows).
    let mut rows_of: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (p, o) in ids().into_values() {
        rows_of.entry(p).or_default().push(o);
    }
    rows_of.values_mut().for_each(|v| v.sort_unstable());
    let mut next_row: BTreeMap<i32, usize> = BTreeMap::new();
    let mut mixed = 0;
    let mut total = 0u64;
    for (recs, pos) in &batches {
        let mut parts: Vec<i32> = recs.iter().map(|r| r.0).collect();
        parts.dedup();
        mixed += usize::from(parts.len() > 1);
        for &(p, o) in recs {
            let i = next_row.entry(p).or_default();
            assert_eq!(
                o, rows_of[&p][*i],
                "partition {p}: rows in offset order, none skipped"
            );
            *i += 1;
        }
        total += recs.len() as u64;
        assert_eq!(pos.rows, total);
        assert_eq!(pos.topic, "t");
        // Each partition's offset is past its last row and at or before its next row: a
        // resume there trains exactly the rows not trained yet.
        assert_eq!(pos.offsets.len(), 4);
        for &(p, o) in &pos.offsets {
            let rows = rows_of.get(&p).map_or(&[][..], |v| v.as_slice());
            let done = next_row.get(&p).copied().unwrap_or(0);
            let lo = if done == 0 { 0 } else { rows[done - 1] + 1 };
            let hi = rows.get(done).copied().unwrap_or(i64::MAX);
            assert!(
                lo <= o && o <= hi,
                "partition {p} at {o}: expected {lo}..={hi}"
            );
        }
    }
    assert!(mixed > 0, "some batches hold records of several partitions");
    assert_eq!(
        batches.last().unwrap().1.offsets,
        [(0, 40), (1, 23), (2, 0), (3, 31)]
    );
}

#[test]
fn a_restart_at_any_batch_position_neither_skips_nor_repeats_a_record() {
    let first = run(start());
    for cut in [0, 1, first.len() / 2, first.len() - 1] {
        let (_, at) = &first[cut];
        let rest = run(at.clone());
        let mut got: Vec<(i32, i64)> = first[..=cut]
            .iter()
            .chain(&rest)
            .flat_map(|(r, _)| r.iter().copied())
            .collect();
        got.sort_unstable();
        let mut all: Vec<(i32, i64)> = ids().into_values().collect();
        all.sort_unstable();
        assert_eq!(got, all, "restart after batch {cut}");
        let end = rest.last().map_or(at, |(_, p)| p);
        assert_eq!(end.rows, all.len() as u64);
    }
}

#[test]
fn a_quiet_topic_hands_out_a_short_batch_and_idle_ticks() {
    // Three rows, then nothing: they go out as one short batch, then idle ticks follow.
    let mut cfg = KafkaConfig::new(vec!["fake:9092".into()], "t");
    cfg.idle_tick = Some(Duration::from_millis(20));
    let stop = Arc::clone(&cfg.stop);
    let mut sent = false;
    let source = move |wait: Duration| {
        if !std::mem::replace(&mut sent, true) {
            let records = (0..3)
                .map(|o| (o, Some(bytes::Bytes::from(line(0, o)))))
                .collect();
            return Poll::Ready(Fetched::Records {
                partition: 0,
                records,
                next: 3,
            });
        }
        std::thread::sleep(wait);
        Poll::Empty
    };
    let start = KafkaPosition {
        topic: "t".into(),
        offsets: vec![(0, 0)],
        rows: 0,
    };
    let mut stream = start_stream(&cfg, &reader(), start, move |feeder, file, ends| {
        pump::pump(feeder, file, Duration::from_millis(5), source, ends)
    })
    .unwrap();
    let b = stream.next().unwrap().unwrap();
    assert_eq!(
        (b.batch.rows, b.position.offsets.clone()),
        (3, vec![(0, 3)])
    );
    let tick = stream.next().unwrap().unwrap();
    assert_eq!((tick.batch.rows, tick.position), (0, b.position));
    stop.store(true, Relaxed);
    assert!(stream.next().is_none());
}

#[test]
fn an_assignment_takes_the_partitions_of_its_rank() {
    let takes = |rank, workers| {
        let a = Assignment { rank, workers };
        (0..10).filter(|&p| a.takes(p)).collect::<Vec<i32>>()
    };
    assert_eq!(takes(0, 3), [0, 3, 6, 9]);
    assert_eq!(takes(1, 3), [1, 4, 7]);
    assert_eq!(takes(2, 3), [2, 5, 8]);
    assert_eq!(takes(0, 1), (0..10).collect::<Vec<_>>());
    // Every partition has exactly one reader, including partitions added later.
    for p in 0..1000 {
        assert_eq!(
            (0..7)
                .filter(|&r| Assignment {
                    rank: r,
                    workers: 7
                }
                .takes(p))
                .count(),
            1
        );
    }
    assert!(!Assignment {
        rank: 0,
        workers: 0
    }
    .takes(0));
    assert!(!Assignment {
        rank: 0,
        workers: 2
    }
    .takes(-2));
}

#[test]
fn an_assignment_with_a_rank_past_the_readers_is_refused() {
    let mut cfg = KafkaConfig::new(vec!["127.0.0.1:9".into()], "t");
    cfg.assign = Some(Assignment {
        rank: 3,
        workers: 3,
    });
    let Err(e) = consume(cfg, &reader()) else {
        panic!("accepted")
    };
    assert!(e.to_string().contains("reader 3 of 3"), "{e}");
}

#[test]
fn offsets_without_rows_pass_with_the_records_before_them() {
    // Partition 0: rows at 0 and 1, then offsets 2..6 hold no rows (an aborted transaction
    // and its marker): the fetcher says the partition stands at 6 after record 1.
    let mut cfg = KafkaConfig::new(vec!["fake:9092".into()], "t");
    cfg.linger = Duration::from_millis(1);
    let mut sent = 0;
    let source = move |_wait: Duration| {
        sent += 1;
        match sent {
            1 => Poll::Ready(Fetched::Records {
                partition: 0,
                records: (0..2)
                    .map(|o| (o, Some(bytes::Bytes::from(line(0, o)))))
                    .collect(),
                next: 6,
            }),
            // A marker with nothing to release: only the position moves.
            2 => Poll::Ready(Fetched::Records {
                partition: 0,
                records: Vec::new(),
                next: 7,
            }),
            3 => Poll::Ready(Fetched::Records {
                partition: 0,
                records: vec![(7, Some(bytes::Bytes::from(line(0, 7))))],
                next: 8,
            }),
            _ => Poll::Closed,
        }
    };
    let start = KafkaPosition {
        topic: "t".into(),
        offsets: vec![(0, 0)],
        rows: 0,
    };
    let stream = start_stream(&cfg, &reader(), start, move |feeder, file, ends| {
        pump::pump(feeder, file, Duration::from_millis(1), source, ends)
    })
    .unwrap();
    let batches: Vec<_> = stream.map(|b| b.unwrap()).collect();
    let rows: usize = batches.iter().map(|b| b.batch.rows).sum();
    assert_eq!(rows, 3);
    assert_eq!(batches.last().unwrap().position.offsets, [(0, 8)]);
    // A boundary after record 1 (if the records fall in two batches) stands past the offsets
    // without rows: at 6, or at 7 once the second position was logged.
    for b in &batches[..batches.len() - 1] {
        let o = b.position.offsets[0].1;
        assert!(o == 6 || o == 7, "{:?}", b.position);
    }
}

/// Topic `t`, partition 0: `batches` batches of 10 records (record `o` is `line(0, o)`).
fn fake_log(batches: i64) -> fake::State {
    use super::batches::tests::{encode, record};
    use kafka_protocol::records::Compression;
    let mut st = fake::State {
        topic: "t".into(),
        ..fake::State::default()
    };
    for b in 0..batches {
        let recs: Vec<_> = (b * 10..b * 10 + 10)
            .map(|o| record(o, Some(&line(0, o)), None))
            .collect();
        st.append(0, encode(&recs, Compression::Lz4));
    }
    st
}

/// Drains the fake cluster's topic through its first broker, one batch per fetch: the rows
/// read, the last position, and the error that ended the stream (if any).
fn drain_fake(cluster: &fake::FakeCluster) -> (usize, Vec<(i32, i64)>, Option<DataError>) {
    let mut cfg = KafkaConfig::new(vec![cluster.addrs[0].clone()], "t");
    cfg.drain = true;
    cfg.fetch_bytes = 1;
    cfg.linger = Duration::from_millis(1);
    let mut rows = 0;
    let mut last = Vec::new();
    for b in consume(cfg, &reader()).unwrap() {
        match b {
            Ok(b) => {
                rows += b.batch.rows;
                last = b.position.offsets;
            }
            Err(e) => return (rows, last, Some(e)),
        }
    }
    (rows, last, None)
}

#[test]
fn a_moved_leader_is_asked_for_again_and_read_on_its_new_broker() {
    let mut st = fake_log(5);
    // Fetch 0 probes the end, fetch 1 reads the first batch; then the leader moves to
    // broker 1, which only the metadata of broker 0 (the one bootstrap broker) names.
    st.move_leaders_after = Some(2);
    let cluster = fake::FakeCluster::start(2, st);
    let (rows, last, err) = drain_fake(&cluster);
    assert!(err.is_none(), "{err:?}");
    assert_eq!((rows, last), (50, vec![(0, 50)]));
    let fetches = cluster.state.lock().unwrap().fetches.clone();
    assert!(fetches.iter().any(|f| f.0 == 1), "{fetches:?}");
}

#[test]
fn a_connection_dropped_mid_fetch_is_retried() {
    let mut st = fake_log(5);
    st.drop_fetch = Some(2);
    let cluster = fake::FakeCluster::start(1, st);
    let (rows, last, err) = drain_fake(&cluster);
    assert!(err.is_none(), "{err:?}");
    assert_eq!((rows, last), (50, vec![(0, 50)]));
    let fetches = cluster.state.lock().unwrap().fetches.clone();
    let at_10 = fetches.iter().filter(|f| f.2 == 10).count();
    assert_eq!(at_10, 2, "the dropped fetch asked again: {fetches:?}");
}

#[test]
fn a_corrupt_batch_stops_the_stream_naming_topic_partition_and_offset() {
    let mut st = fake_log(3);
    // The second batch (offsets 10..20) gets a bad CRC.
    let log = st.logs.get_mut(&0).unwrap();
    let mut bad = bytes::BytesMut::from(&log[1].2[..]);
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    log[1].2 = bad.freeze();
    let cluster = fake::FakeCluster::start(1, st);
    let (rows, last, err) = drain_fake(&cluster);
    // Full batches of the rows before it come out (a part-filled one ends with the error),
    // each with its exact position; nothing after it.
    assert!(rows <= 10, "{rows}");
    assert_eq!(last, vec![(0, rows as i64)]);
    let e = err.expect("the stream stops with an error").to_string();
    assert!(e.contains("topic t partition 0 offset 10"), "{e}");
    assert!(e.contains("Cyclic redundancy check failed"), "{e}");
    let fetches = cluster.state.lock().unwrap().fetches.clone();
    let at_10 = fetches.iter().filter(|f| f.2 == 10).count();
    assert_eq!(at_10, 1, "not retried: {fetches:?}");
}

#[test]
fn the_lag_is_the_high_watermark_less_the_next_offset_of_each_partition() {
    let m = LagMeter::default();
    m.started(0, 5);
    m.started(1, 0);
    assert!(m.lag().is_empty(), "nothing fetched yet");
    m.high_watermark(0, 20);
    m.high_watermark(1, 3);
    assert_eq!(m.lag(), [(0, 15), (1, 3)]);
    m.advanced(&[(0, 18), (1, 3)], 16);
    assert_eq!(m.lag(), [(0, 2), (1, 0)]);
    assert_eq!(m.rows(), 16);
    // A stale answer (a watermark below the position) reads as no lag, never negative.
    m.high_watermark(0, 10);
    assert_eq!(m.lag(), [(0, 0), (1, 0)]);
}

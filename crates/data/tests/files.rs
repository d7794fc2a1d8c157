//! File-level behaviour on generated inputs: epochs, limits, headers, line ends,
//! multi-valued fields, gzip, and early drop.

mod common;

use std::time::{Duration, Instant};

use common::*;
use sparta_data::{feature_id, missing_id, read_all, read_batches, Column, ColumnKind, Schema};

#[test]
fn epochs_and_max_rows() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_file(dir.path(), "a.tsv", criteo_text(1500).as_bytes());
    let mut cfg = config(Schema::criteo(), 256, 3);
    cfg.epochs = 2;
    let (b, st) = read_all(std::slice::from_ref(&p), &cfg).unwrap();
    assert_eq!(st.rows, 3000);
    assert_eq!(st.files, 2);
    let all = rows(&b);
    let (once, _) = read_all(std::slice::from_ref(&p), &config(Schema::criteo(), 256, 1)).unwrap();
    let mut twice = rows(&once);
    twice.extend(rows(&once));
    assert_eq!(sorted(all), sorted(twice));

    cfg.max_rows = Some(1000);
    let (b, st) = read_all(std::slice::from_ref(&p), &cfg).unwrap();
    assert_eq!(b.iter().map(|b| b.rows).sum::<usize>(), 1000);
    assert_eq!(st.rows, 1000);
    cfg.max_rows = Some(0);
    assert!(read_all(&[p], &cfg).unwrap().0.is_empty());
}

#[test]
fn several_files_in_order_with_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let text = criteo_text(300);
    let (head, tail) = text.split_at(text.find("\n").unwrap() * 100 + 100);
    let head_end = head.rfind('\n').unwrap() + 1;
    let a = write_file(dir.path(), "a.tsv", &text.as_bytes()[..head_end]);
    let b = write_file(
        dir.path(),
        "b.gz",
        &gzip(format!("{}{}", &head[head_end..], tail).as_bytes()),
    );
    let e = write_file(dir.path(), "empty.tsv", b"");
    let whole = write_file(dir.path(), "whole.tsv", text.as_bytes());
    let cfg = config(Schema::criteo(), 64, 1);
    let (split, st) = read_all(&[a, e, b], &cfg).unwrap();
    let (one, _) = read_all(&[whole], &cfg).unwrap();
    assert_eq!(rows(&split), rows(&one));
    assert_eq!(st.files, 3);
}

#[test]
fn header_crlf_and_last_line_without_newline() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema {
        header: true,
        ..Schema::criteo()
    };
    let body: Vec<String> = (0..50).map(|i| criteo_line(1, i)).collect();
    let crlf = format!("label\tI1\tjunk header\r\n{}", body.join("\r\n"));
    let lf = write_file(
        dir.path(),
        "lf.tsv",
        format!("h\n{}\n", body.join("\n")).as_bytes(),
    );
    let cr = write_file(dir.path(), "crlf.tsv", crlf.as_bytes());
    let gz = write_file(dir.path(), "crlf.gz", &gzip(crlf.as_bytes()));
    let cfg = config(schema, 16, 1);
    let (want, st) = read_all(&[lf], &cfg).unwrap();
    assert_eq!((st.rows, st.bad_lines), (50, 0));
    for p in [cr, gz] {
        let (got, st) = read_all(&[p], &cfg).unwrap();
        assert_eq!((st.rows, st.bad_lines), (50, 0));
        assert_eq!(got, want);
    }
}

#[test]
fn multi_valued_field() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema {
        columns: vec![
            Column::new("click", ColumnKind::Label),
            Column::new("price", ColumnKind::Dense),
            Column::new("user", ColumnKind::Sparse),
            Column::new("tags", ColumnKind::MultiSparse { separator: '|' }),
        ],
        separator: ',',
        header: true,
    };
    let p = write_file(
        dir.path(),
        "m.csv",
        b"click,price,user,tags\n1,2.5,u1,a|b|c\n0,,u2,\n1,-3,,d\n",
    );
    let (b, st) = read_all(&[p], &config(schema, 10, 1)).unwrap();
    assert_eq!(st.rows, 3);
    let b = &b[0];
    assert!(!b.is_single_valued());
    assert_eq!(b.labels, vec![1.0, 0.0, 1.0]);
    assert_eq!(
        b.ids_of(0, 1),
        &[
            feature_id(1, b"a"),
            feature_id(1, b"b"),
            feature_id(1, b"c")
        ]
    );
    assert_eq!(b.ids_of(1, 1), &[missing_id(1)]);
    assert_eq!(b.ids_of(2, 0), &[missing_id(0)]);
    assert_eq!(b.ids_of(2, 1), &[feature_id(1, b"d")]);
    assert_eq!(b.dense, vec![3.5f32.ln(), 0.0, -(4f32.ln())]);
}

#[test]
fn many_threads_large_file_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    // big enough for several chunks per thread
    let text = criteo_text(6000);
    let p = write_file(dir.path(), "big.tsv", text.as_bytes());
    let (one, _) = read_all(std::slice::from_ref(&p), &config(Schema::criteo(), 1000, 1)).unwrap();
    let (many, st) = read_all(&[p], &config(Schema::criteo(), 1000, 8)).unwrap();
    assert_eq!(st.rows, 6000);
    assert_eq!(st.bytes, text.len() as u64);
    assert_eq!(sorted(rows(&many)), sorted(rows(&one)));
}

#[test]
fn dropping_early_does_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_file(dir.path(), "a.tsv", criteo_text(5000).as_bytes());
    let g = write_file(dir.path(), "a.gz", &gzip(criteo_text(5000).as_bytes()));
    for path in [p, g] {
        let mut cfg = config(Schema::criteo(), 8, 4);
        cfg.queue_batches = 1;
        cfg.epochs = 1000;
        let t = Instant::now();
        let mut s = read_batches(&[path], &cfg).unwrap();
        let first = s.next().unwrap().unwrap();
        assert_eq!(first.rows, 8);
        drop(s);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "drop took {:?}",
            t.elapsed()
        );
    }
}

/// The reader parses through `cfg.plan`: a weighted bag and a sequence over one column come
/// back as the plan's fields, with one weight per id, however the lines are cut into batches.
#[test]
fn the_reader_follows_the_input_plan() {
    use sparta_data::features::{InputPlan, Pooling, Slot, SlotKind};
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema {
        columns: vec![
            Column::new("label", ColumnKind::Label),
            Column::new("tags", ColumnKind::MultiSparse { separator: '|' }),
        ],
        separator: '\t',
        header: false,
    };
    let text: String = (0..500)
        .map(|i| format!("{}\tt{}:{}|u{}\n", i % 2, i % 7, i % 5, i % 3))
        .collect();
    let p = write_file(dir.path(), "a.tsv", text.as_bytes());
    let plan = InputPlan {
        slots: vec![
            Slot {
                name: "seq".into(),
                column: 1,
                tag: 4,
                kind: SlotKind::Sequence { max_len: 1 },
            },
            Slot {
                name: "tags".into(),
                column: 1,
                tag: 9,
                kind: SlotKind::Bag {
                    pooling: Pooling::Sum,
                    weighted: true,
                    weight_separator: b':',
                },
            },
        ],
        dense: vec![],
    };
    plan.validate(&schema).unwrap();
    let mut cfg = config(schema, 64, 2);
    cfg.plan = Some(std::sync::Arc::new(plan));
    let (batches, st) = read_all(&[p], &cfg).unwrap();
    assert_eq!(st.rows, 500);
    let mut weight_sum = 0.0;
    for b in &batches {
        b.check_tags(&[4, 9]).unwrap();
        assert_eq!((b.num_fields, b.num_dense), (2, 0));
        assert_eq!(b.weights.len(), b.ids.len());
        for r in 0..b.rows {
            assert_eq!(b.ids_of(r, 0).len(), 1);
            assert_eq!(b.ids_of(r, 1).len(), 2);
            weight_sum += b.weights_of(r, 1).unwrap().iter().sum::<f32>();
        }
    }
    let want: f32 = (0..500).map(|i| (i % 5) as f32 + 1.0).sum();
    assert_eq!(weight_sum, want);
}

/// Two labels and a sample weight through the whole reader (several chunks, parser threads,
/// batches cut across blocks): the batches are the rows of the lines, in order, with strided
/// labels and one sample weight per row; a bad weight or a bad second label drops its line.
#[test]
fn several_labels_and_a_sample_weight_through_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema {
        columns: vec![
            Column::new("click", ColumnKind::Label),
            Column::new("user", ColumnKind::Sparse),
            Column::new("w", ColumnKind::Weight),
            Column::new("x", ColumnKind::Dense),
            Column::new("conversion", ColumnKind::Label),
        ],
        separator: '\t',
        header: false,
    };
    schema.validate().unwrap();
    let n = 20_000;
    let mut text = String::new();
    let mut want = Vec::new();
    for i in 0..n {
        let (click, conv) = (i % 3 == 0, i % 6 == 0);
        let weight = match i % 4 {
            0 => String::new(),
            1 => "0.5".into(),
            2 => "0".into(),
            _ => format!("{}e-1", i % 50),
        };
        let (weight, conv_text) = match i % 1000 {
            7 => ("-1".to_string(), "0".to_string()), // a bad weight
            8 => (weight, "2".to_string()),           // a bad second label
            _ => (weight, u8::from(conv).to_string()),
        };
        text.push_str(&format!(
            "{}\tuser{}\t{weight}\t{i}\t{conv_text}\n",
            u8::from(click),
            i % 97
        ));
        if !matches!(i % 1000, 7 | 8) {
            let w: f32 = if weight.is_empty() {
                1.0
            } else {
                weight.parse().unwrap()
            };
            want.push((
                [f32::from(u8::from(click)), f32::from(u8::from(conv))],
                w,
                feature_id(0, format!("user{}", i % 97).as_bytes()),
            ));
        }
    }
    assert!(text.len() > 256 << 10, "several chunks");
    let p = write_file(dir.path(), "two.tsv", text.as_bytes());
    let mut cfg = config(schema, 333, 3);
    cfg.max_bad_line_ratio = 0.01;
    let (batches, st) = read_all(&[p], &cfg).unwrap();
    assert_eq!((st.rows, st.bad_lines), (want.len() as u64, 40));
    let first = st.first_bad_lines.join("\n");
    assert!(first.contains("sample weight \"w\""), "{first}");
    assert!(first.contains("label \"conversion\""), "{first}");
    let mut got = Vec::new();
    for b in &batches {
        b.check().unwrap();
        assert_eq!(b.num_labels, 2);
        assert_eq!(b.sample_weights.len(), b.rows);
        for r in 0..b.rows {
            let l = b.labels_of(r);
            got.push(([l[0], l[1]], b.sample_weight(r), b.ids_of(r, 0)[0]));
        }
    }
    assert_eq!(got, want);
    let (last, full) = batches.split_last().unwrap();
    assert!(full.iter().all(|b| b.rows == 333) && last.rows <= 333);
}

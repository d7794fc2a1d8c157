//! Tests of the line parser: legacy rows, labels and weights, the plan's slots and dense
//! inputs, and the legacy plan against the parser before plans (bit for bit).

use super::*;
use crate::batch::{log_transform, BatchBuilder};
use crate::features::{DenseTransform, InputPlan, SlotKind};
use crate::ids::{feature_id, missing_id};
use crate::schema::{Column, ColumnKind, Schema};

fn parse(schema: &Schema, line: &[u8]) -> Result<crate::Batch, BadLine> {
    let p = LineParser::new(schema);
    let mut b = BatchBuilder::new(p.num_fields(), p.num_dense(), 1);
    p.parse_line(line, &mut b)?;
    let batch = b.take();
    batch.check_tags(&batch.legacy_tags()).unwrap();
    Ok(batch)
}

fn criteo_line(label: &str, ints: &[&str], cats: &[&str]) -> Vec<u8> {
    let mut cols = vec![label];
    cols.extend_from_slice(ints);
    cols.extend_from_slice(cats);
    cols.join("\t").into_bytes()
}

#[test]
fn dense_values() {
    assert_eq!(parse_dense(b""), Some(0.0));
    assert_eq!(parse_dense(b"0"), Some(0.0));
    assert_eq!(parse_dense(b"3"), Some(log_transform(3.0)));
    assert_eq!(parse_dense(b"-2"), Some(log_transform(-2.0)));
    assert_eq!(parse_dense(b"+7"), Some(log_transform(7.0)));
    assert_eq!(parse_dense(b"1.5"), Some(log_transform(1.5)));
    assert_eq!(parse_dense(b"-0.25"), Some(log_transform(-0.25)));
    assert_eq!(parse_dense(b"1e3"), Some(log_transform(1000.0)));
    let big = parse_dense(b"1125899906842624").unwrap(); // 2^50: the largest accepted
    assert!((big - log_transform(1125899906842624.0)).abs() < 1e-5);
    assert_eq!(parse_dense(b"-1125899906842624"), Some(-big));
    // Beyond MAX_ABS_DENSE: malformed, not a saturating input.
    for absurd in [
        &b"1125899906842625"[..],
        b"12345678901234567890123",
        b"1e308",
        b"-1e300",
    ] {
        assert_eq!(
            parse_dense(absurd),
            None,
            "{:?}",
            String::from_utf8_lossy(absurd)
        );
    }
    for bad in [
        &b"abc"[..],
        b"1.5x",
        b"-",
        b"+",
        b" 1",
        b"1 ",
        b"nan",
        b"inf",
        b"0x10",
    ] {
        assert_eq!(parse_dense(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn labels() {
    for (s, v) in [(&b"0"[..], 0.0), (b"1", 1.0), (b"0.0", 0.0), (b"1.0", 1.0)] {
        assert_eq!(parse_label(s), Some(v));
    }
    for bad in [&b""[..], b"2", b"-1", b"0.5", b"yes", b"1x"] {
        assert_eq!(parse_label(bad), None);
    }
}

#[test]
fn criteo_row() {
    let s = Schema::criteo();
    let mut ints = vec!["1"; 13];
    ints[1] = "";
    ints[2] = "-1";
    let mut cats = vec!["68fd1e64"; 26];
    cats[3] = "";
    let line = criteo_line("1", &ints, &cats);
    let b = parse(&s, &line).unwrap();
    assert_eq!(b.rows, 1);
    assert_eq!(b.labels, vec![1.0]);
    assert_eq!(b.dense[0], 2f32.ln());
    assert_eq!(b.dense[1], 0.0);
    assert_eq!(b.dense[2], -(2f32.ln()));
    assert!(b.is_single_valued());
    assert_eq!(b.ids[0], feature_id(0, b"68fd1e64"));
    assert_eq!(b.ids[3], missing_id(3));
    assert_eq!(b.ids[25], feature_id(25, b"68fd1e64"));
    // \r\n line end gives the same row
    let mut crlf = line.clone();
    crlf.push(b'\r');
    assert_eq!(parse(&s, &crlf).unwrap(), b);
}

#[test]
fn a_leading_utf8_bom_is_not_part_of_the_row() {
    let s = Schema::criteo();
    let line = criteo_line("1", &["1"; 13], &["68fd1e64"; 26]);
    let with_bom = [&b"\xEF\xBB\xBF"[..], &line].concat();
    assert_eq!(parse(&s, &with_bom).unwrap(), parse(&s, &line).unwrap());
}

#[test]
fn multi_sparse_field() {
    let s = Schema {
        columns: vec![
            Column::new("y", ColumnKind::Label),
            Column::new("x", ColumnKind::Dense),
            Column::new("skip", ColumnKind::Ignore),
            Column::new("tags", ColumnKind::MultiSparse { separator: '|' }),
            Column::new("city", ColumnKind::Sparse),
        ],
        separator: ',',
        header: false,
    };
    let b = parse(&s, b"0,2.5,whatever,a|b||c,paris").unwrap();
    assert_eq!(
        b.ids_of(0, 0),
        &[
            feature_id(0, b"a"),
            feature_id(0, b"b"),
            feature_id(0, b"c")
        ]
    );
    assert_eq!(b.ids_of(0, 1), &[feature_id(1, b"paris")]);
    assert!(!b.is_single_valued());
    let b = parse(&s, b"1,,,||,").unwrap();
    assert_eq!(b.ids, vec![missing_id(0), missing_id(1)]);
    assert!(b.is_single_valued());
}

#[test]
fn bad_lines() {
    let s = Schema::criteo();
    let good = criteo_line("0", &["1"; 13], &["ab"; 26]);
    let cases: Vec<(Vec<u8>, BadLine)> = vec![
        (
            good.split(|&b| b == b'\t')
                .take(20)
                .collect::<Vec<_>>()
                .join(&b'\t'),
            BadLine::TooFewColumns {
                found: 20,
                expected: 40,
            },
        ),
        (
            [&good[..], b"\textra\tmore"].concat(),
            BadLine::TooManyColumns {
                found: 42,
                expected: 40,
            },
        ),
        (
            criteo_line("2", &["1"; 13], &["ab"; 26]),
            BadLine::BadLabel {
                column: "label".into(),
            },
        ),
        (
            criteo_line(
                "0",
                &[
                    "1", "abc", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1",
                ],
                &["ab"; 26],
            ),
            BadLine::BadDense {
                column: "I2".into(),
            },
        ),
        (
            [&good[..10], &[0xff, 0xfe][..], &good[10..]].concat(),
            BadLine::InvalidUtf8,
        ),
        (
            vec![b'a'; MAX_LINE_BYTES + 1],
            BadLine::TooLong {
                len: MAX_LINE_BYTES + 1,
            },
        ),
    ];
    let p = LineParser::new(&s);
    let mut b = BatchBuilder::new(26, 13, 4);
    for (line, want) in cases {
        assert_eq!(p.parse_line(&line, &mut b), Err(want));
        assert_eq!(b.rows(), 0);
    }
    p.parse_line(&good, &mut b).unwrap();
    let batch = b.take();
    batch.check().unwrap();
    assert_eq!(batch.rows, 1);
}

/// click (label), user (sparse), w (weight), x (dense), conversion (label).
fn two_label_schema() -> Schema {
    Schema {
        columns: vec![
            Column::new("click", ColumnKind::Label),
            Column::new("user", ColumnKind::Sparse),
            Column::new("w", ColumnKind::Weight),
            Column::new("x", ColumnKind::Dense),
            Column::new("conversion", ColumnKind::Label),
        ],
        separator: '\t',
        header: false,
    }
}

fn parse_two(lines: &[&str]) -> Result<crate::Batch, BadLine> {
    let s = two_label_schema();
    s.validate().unwrap();
    let p = LineParser::new(&s);
    let mut b = p.builder(lines.len());
    for l in lines {
        p.parse_line(l.as_bytes(), &mut b)?;
    }
    let batch = b.take();
    batch.check_tags(&batch.legacy_tags()).unwrap();
    Ok(batch)
}

#[test]
fn sample_weights() {
    for (s, w) in [
        (&b""[..], 1.0),
        (b"1", 1.0),
        (b"0", 0.0),
        (b"-0", 0.0),
        (b"0.5", 0.5),
        (b"2e-1", 0.2),
        (b"+3", 3.0),
        (b"1e30", 1e30),
    ] {
        assert_eq!(parse_sample_weight(s), Some(w), "{s:?}");
    }
    assert!(parse_sample_weight(b"-0").unwrap().is_sign_positive());
    for bad in [
        &b"-1"[..],
        b"-0.5",
        b"nan",
        b"NaN",
        b"inf",
        b"1e39",
        b"x",
        b" 1",
        b"1,5",
    ] {
        assert_eq!(parse_sample_weight(bad), None, "{bad:?}");
    }
}

#[test]
fn two_labels_and_a_weight_parse_into_strided_rows() {
    let s = two_label_schema();
    let p = LineParser::new(&s);
    assert_eq!((p.num_labels(), p.label_column()), (2, 0));
    assert_eq!(p.label_columns(), &[0, 4]);
    assert_eq!(p.weight_column(), Some(2));
    assert_eq!(p.used_columns(), vec![0, 1, 2, 3, 4]);
    let b = parse_two(&["1\tu1\t0.5\t3\t0", "0\tu2\t\t\t0", "1.0\tu3\t2e-1\t1\t1"]).unwrap();
    assert_eq!((b.rows, b.num_labels), (3, 2));
    assert_eq!(b.labels, vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
    assert_eq!(b.sample_weights, vec![0.5, 1.0, 0.2]);
    assert_eq!(b.dense, vec![log_transform(3.0), 0.0, log_transform(1.0)]);
    assert_eq!(
        b.ids,
        vec![
            feature_id(0, b"u1"),
            feature_id(0, b"u2"),
            feature_id(0, b"u3")
        ]
    );
    assert_eq!(b.positives(), 2);
    // the label and weight columns are not features: an explicit plan reading one is refused
    let mut plan = InputPlan::legacy(&s);
    assert_eq!((plan.num_slots(), plan.num_dense()), (1, 1));
    plan.dense[0].column = 2;
    let e = plan.validate(&s).unwrap_err().to_string();
    assert!(e.contains("of kind \"weight\""), "{e}");
    plan.dense[0].column = 4;
    let e = plan.validate(&s).unwrap_err().to_string();
    assert!(e.contains("of kind \"label\""), "{e}");
}

#[test]
fn a_bad_weight_or_a_bad_second_label_makes_the_row_bad() {
    for bad in ["-1", "nan", "x", "inf", "-0.5"] {
        let line = format!("1\tu\t{bad}\t3\t0");
        let e = parse_two(&[&line]).unwrap_err();
        assert_eq!(e, BadLine::BadSampleWeight { column: "w".into() }, "{bad}");
        assert_eq!(
            e.to_string(),
            "sample weight \"w\" is not a finite number >= 0"
        );
    }
    for bad in ["2", "", "yes", "0.5"] {
        let line = format!("1\tu\t1\t3\t{bad}");
        assert_eq!(
            parse_two(&[&line]).unwrap_err(),
            BadLine::BadLabel {
                column: "conversion".into()
            },
            "{bad:?}"
        );
    }
    // a bad row leaves nothing behind (labels, weight) and the next row is whole
    let s = two_label_schema();
    let p = LineParser::new(&s);
    let mut b = p.builder(2);
    assert!(p.parse_line(b"1\tu\t1\t3\t2", &mut b).is_err());
    assert!(p.parse_line(b"1\tu\t-1\t3\t1", &mut b).is_err());
    p.parse_line(b"0\tv\t4\t\t0", &mut b).unwrap();
    let b = b.take();
    b.check().unwrap();
    assert_eq!((b.labels, b.sample_weights), (vec![0.0, 0.0], vec![4.0]));
    // serving values: a missing weight is 1, a missing label is bad
    let mut out = p.builder(1);
    p.parse_values(
        |c| [Some(&b"1"[..]), None, None, None, Some(b"0")][c],
        &mut out,
    )
    .unwrap();
    assert_eq!(out.take().sample_weights, vec![1.0]);
    let mut out = p.builder(1);
    assert!(p
        .parse_values(|c| (c == 0).then_some(&b"1"[..]), &mut out)
        .is_err());
}

// ---- the plan ----

use crate::features::{DenseInput, Pooling, Slot};
use proptest::strategy::Strategy as _;

/// label, user (sparse), tags (multi `|`), hist (multi `|`), price (dense), gone (ignore).
fn rich_schema() -> Schema {
    Schema {
        columns: vec![
            Column::new("label", ColumnKind::Label),
            Column::new("user", ColumnKind::Sparse),
            Column::new("tags", ColumnKind::MultiSparse { separator: '|' }),
            Column::new("hist", ColumnKind::MultiSparse { separator: '|' }),
            Column::new("price", ColumnKind::Dense),
            Column::new("gone", ColumnKind::Ignore),
        ],
        separator: '\t',
        header: false,
    }
}

fn slot(name: &str, column: usize, tag: u8, kind: SlotKind) -> Slot {
    Slot {
        name: name.into(),
        column,
        tag,
        kind,
    }
}

fn weighted_bag() -> SlotKind {
    SlotKind::Bag {
        pooling: Pooling::Mean,
        weighted: true,
        weight_separator: b':',
    }
}

const BOUNDS: [f64; 3] = [1.0, 10.0, 100.0];

/// Features in an order unlike the columns', `hist` read twice (bag and sequence),
/// `price` read twice (buckets and log1p) plus a standardized copy.
fn rich_plan() -> InputPlan {
    InputPlan {
        slots: vec![
            slot("tags", 2, 3, weighted_bag()),
            slot("user", 1, 0, SlotKind::Id),
            slot("hist", 3, 1, SlotKind::Sequence { max_len: 3 }),
            slot(
                "price_b",
                4,
                2,
                SlotKind::Buckets {
                    boundaries: BOUNDS.to_vec(),
                },
            ),
            slot(
                "hist_bag",
                3,
                1,
                SlotKind::Bag {
                    pooling: Pooling::Sum,
                    weighted: false,
                    weight_separator: b':',
                },
            ),
        ],
        dense: vec![
            DenseInput {
                name: "price".into(),
                column: 4,
                transform: DenseTransform::Log1p,
            },
            DenseInput {
                name: "price_z".into(),
                column: 4,
                transform: DenseTransform::Standardize {
                    mean: 10.0,
                    std: 4.0,
                },
            },
        ],
    }
}

fn parse_rich(line: &str) -> Result<crate::Batch, BadLine> {
    let (s, plan) = (rich_schema(), rich_plan());
    plan.validate(&s).unwrap();
    let p = LineParser::with_plan(&s, &plan);
    assert!(p.is_weighted());
    let mut b = p.builder(1);
    p.parse_line(line.as_bytes(), &mut b)?;
    let batch = b.take();
    batch.check_tags(&[3, 0, 1, 2, 1]).unwrap();
    assert_eq!(batch.weights.len(), batch.ids.len());
    Ok(batch)
}

#[test]
fn plan_rows_follow_the_plan_order() {
    let b = parse_rich("1\tu7\ta:0.5|b|c:2e0|:3\tx1|x2|x3|x4|x5\t20\tignored").unwrap();
    assert_eq!((b.num_fields, b.num_dense), (5, 2));
    assert_eq!(
        b.ids_of(0, 0),
        &[
            feature_id(3, b"a"),
            feature_id(3, b"b"),
            feature_id(3, b"c")
        ]
    );
    assert_eq!(b.weights_of(0, 0), Some(&[0.5, 1.0, 2.0][..]));
    assert_eq!(b.ids_of(0, 1), &[feature_id(0, b"u7")]);
    assert_eq!(b.weights_of(0, 1), Some(&[1.0][..]));
    // the sequence keeps the last 3 (most recent), oldest first
    assert_eq!(
        b.ids_of(0, 2),
        &[
            feature_id(1, b"x3"),
            feature_id(1, b"x4"),
            feature_id(1, b"x5")
        ]
    );
    assert_eq!(b.ids_of(0, 3), &[missing_id(2) | 3]);
    // the same column as a whole bag, in the same key space as the sequence
    assert_eq!(b.ids_of(0, 4).len(), 5);
    assert_eq!(b.ids_of(0, 4)[0], feature_id(1, b"x1"));
    assert_eq!(b.dense, vec![log_transform(20.0), 2.5]);
}

/// Found by fuzzing (fuzz/ line_parser): `1e300` is a finite f64, but standardized it
/// was an infinite f32 dense value; the line is now rejected as a bad dense value (by the
/// MAX_ABS_DENSE rule, and by the finite check after the transform).
#[test]
fn a_dense_value_out_of_f32_range_after_its_transform_is_bad() {
    assert_eq!(
        parse_rich("1	u	a	x	1e300	").unwrap_err(),
        BadLine::BadDense {
            column: "price".into()
        }
    );
    // 1e15 (within MAX_ABS_DENSE) stays finite after either transform.
    let b = parse_rich("1	u	a	x	1e15	").unwrap();
    assert!(b.dense.iter().all(|x| x.is_finite()), "{:?}", b.dense);
}

#[test]
fn absurd_dense_values_make_the_line_malformed() {
    // `price` feeds buckets, log1p and standardize: 2^50 is accepted by all three.
    let ok = parse_rich("1\tu\ta\tx\t1125899906842624\tz").unwrap();
    assert_eq!(ok.ids_of(0, 3), &[missing_id(2) | 4]);
    assert!(ok.dense.iter().all(|v| v.is_finite()));
    for absurd in ["1e308", "-1e16", "2e15"] {
        let line = format!("1\tu\ta\tx\t{absurd}\tz");
        assert_eq!(
            parse_rich(&line),
            Err(BadLine::BadDense {
                column: "price".into()
            }),
            "{absurd}"
        );
    }
}

#[test]
fn empty_bag_sequence_and_numbers_are_missing() {
    let b = parse_rich("0\t\t|||\t\t\t").unwrap();
    assert_eq!(
        b.ids,
        vec![
            missing_id(3),
            missing_id(0),
            missing_id(1),
            missing_id(2),
            missing_id(1)
        ]
    );
    assert_eq!(b.weights, vec![1.0; 5]);
    // missing is 0 after either transform
    assert_eq!(b.dense, vec![0.0, 0.0]);
    // a short sequence is kept whole
    let b = parse_rich("0\t\t\ty1||y2\t\t").unwrap();
    assert_eq!(
        b.ids_of(0, 2),
        &[feature_id(1, b"y1"), feature_id(1, b"y2")]
    );
}

#[test]
fn bad_weights_are_refused_naming_the_column() {
    for bad in ["a:x", "a:", "a:nan", "a:inf", "b|a:1e60", "a:1:2x"] {
        let line = format!("0\tu\t{bad}\t\t1\t");
        let e = parse_rich(&line).unwrap_err();
        assert_eq!(
            e,
            BadLine::BadWeight {
                column: "tags".into()
            },
            "{bad}"
        );
        assert!(e.to_string().contains("\"tags\"") && e.to_string().contains("weight"));
    }
    // the weight is after the LAST separator; the value keeps the others
    let b = parse_rich("0\tu\tk:v:0.25\t\t1\t").unwrap();
    assert_eq!(b.ids_of(0, 0), &[feature_id(3, b"k:v")]);
    assert_eq!(b.weights_of(0, 0), Some(&[0.25][..]));
    // a bad bucketized number is a bad dense value of its column
    assert_eq!(
        parse_rich("0\tu\t\t\tcheap\t").unwrap_err(),
        BadLine::BadDense {
            column: "price".into()
        }
    );
}

#[test]
fn buckets_at_and_around_the_boundaries() {
    let bucket = |x: &str| {
        parse_rich(&format!("0\tu\t\t\t{x}\t"))
            .unwrap()
            .ids_of(0, 3)[0]
    };
    for (x, i) in [
        ("-5", 0),
        ("0.999", 0),
        ("1", 1),
        ("1.0", 1),
        ("1.001", 1),
        ("9.99", 1),
        ("10", 2),
        ("99", 2),
        ("100", 3),
        ("1e9", 3),
    ] {
        assert_eq!(bucket(x), missing_id(2) | (i + 1), "{x}");
    }
    assert_eq!(bucket(""), missing_id(2));
    assert_eq!(bucket_id(7, &BOUNDS, f64::MAX), (7 << 56) | 4);
}

#[test]
fn standardize_values() {
    let b = parse_rich("0\tu\t\t\t18\t").unwrap();
    assert_eq!(b.dense, vec![log_transform(18.0), 2.0]);
    let b = parse_rich("0\tu\t\t\t-2\t").unwrap();
    assert_eq!(b.dense[1], -3.0);
}

#[test]
fn unread_columns_are_not_parsed() {
    // `gone` is ignored; with a plan that reads no dense column a bad number is not seen
    let s = rich_schema();
    let plan = InputPlan {
        slots: vec![slot("user", 1, 0, SlotKind::Id)],
        dense: vec![],
    };
    let p = LineParser::with_plan(&s, &plan);
    assert!(!p.is_weighted());
    let mut b = p.builder(1);
    p.parse_line(b"1\tu\tnot:weighted:x\t\tcheap\tzzz", &mut b)
        .unwrap();
    let batch = b.take();
    assert_eq!(batch.ids, vec![feature_id(0, b"u")]);
    assert!(batch.weights.is_empty());
    // the column count is still checked, and the label always read
    assert!(matches!(
        p.parse_line(b"1\tu", &mut b),
        Err(BadLine::TooFewColumns { .. })
    ));
    assert!(matches!(
        p.parse_line(b"x\tu\t\t\t\t", &mut b),
        Err(BadLine::BadLabel { .. })
    ));
    assert_eq!(b.rows(), 0);
}

#[test]
fn parse_values_equals_parse_line() {
    let (s, plan) = (rich_schema(), rich_plan());
    let p = LineParser::with_plan(&s, &plan);
    let line = "1\tu\ta:2|b\th1|h2\t3.5\tq";
    let mut from_line = p.builder(1);
    p.parse_line(line.as_bytes(), &mut from_line).unwrap();
    let cols: Vec<&str> = line.split('\t').collect();
    let mut from_values = p.builder(1);
    p.parse_values(|c| Some(cols[c].as_bytes()), &mut from_values)
        .unwrap();
    assert_eq!(from_line.take(), from_values.take());
    // None is missing
    let mut b = p.builder(1);
    p.parse_values(|c| (c == 0).then_some(&b"0"[..]), &mut b)
        .unwrap();
    assert_eq!(b.take().ids[1], missing_id(0));
}

/// The parser before input plans, column by column (the reference the legacy plan must
/// reproduce bit for bit).
fn old_parser(schema: &Schema, line: &[u8]) -> Option<crate::Batch> {
    let cols: Vec<&[u8]> = line.split(|&b| b == schema.separator as u8).collect();
    if cols.len() != schema.columns.len() {
        return None;
    }
    let mut b = BatchBuilder::new(schema.num_fields(), schema.num_dense(), 1)
        .with_labels(schema.num_labels())
        .with_sample_weights(schema.weight_index().is_some());
    b.begin_row();
    let mut field = 0u8;
    for (c, v) in schema.columns.iter().zip(cols) {
        match c.kind {
            ColumnKind::Label => b.push_label(parse_label(v)?),
            ColumnKind::Weight => b.push_sample_weight(parse_sample_weight(v)?),
            ColumnKind::Dense => b.push_dense(parse_dense(v)?),
            ColumnKind::Sparse => {
                b.push_id(if v.is_empty() {
                    missing_id(field)
                } else {
                    feature_id(field, v)
                });
                b.end_field();
                field += 1;
            }
            ColumnKind::MultiSparse { separator } => {
                let items: Vec<_> = v
                    .split(|&x| x == separator as u8)
                    .filter(|x| !x.is_empty())
                    .collect();
                if items.is_empty() {
                    b.push_id(missing_id(field));
                }
                for it in items {
                    b.push_id(feature_id(field, it));
                }
                b.end_field();
                field += 1;
            }
            ColumnKind::Ignore => {}
        }
    }
    b.end_row();
    Some(b.take())
}

fn legacy_matches_old(schema: &Schema, line: &[u8]) {
    let p = LineParser::new(schema);
    let mut b = p.builder(1);
    let new = p.parse_line(line, &mut b).ok().map(|()| b.take());
    let old = old_parser(schema, line);
    assert_eq!(new, old, "{:?}", String::from_utf8_lossy(line));
    if let Some(n) = new {
        assert!(n.weights.is_empty());
    }
}

#[test]
fn legacy_avazu_row_is_unchanged() {
    let s = Schema::avazu();
    let cols: Vec<String> = s
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| match c.kind {
            ColumnKind::Label => "1".into(),
            ColumnKind::Dense => format!("{i}"),
            _ if i % 5 == 0 => String::new(),
            _ => format!("v{i}"),
        })
        .collect();
    let line = cols.join(&s.separator.to_string());
    legacy_matches_old(&s, line.as_bytes());
    let p = LineParser::new(&s);
    let mut b = p.builder(1);
    p.parse_line(line.as_bytes(), &mut b).unwrap();
    let b = b.take();
    b.check_tags(&b.legacy_tags()).unwrap();
    assert_eq!(b.num_fields, s.num_fields());
}

proptest::proptest! {
    /// Criteo lines (some values missing, some dense values bad, some column counts
    /// wrong): the legacy plan gives the old parser's batch, bit for bit.
    #[test]
    fn legacy_criteo_batches_are_unchanged(
        label in proptest::sample::select(vec!["0", "1", "1.0", "2", ""]),
        ints in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just(String::new()),
                (-1000i64..100000).prop_map(|v| v.to_string()),
                (-1e6f64..1e6).prop_map(|v| v.to_string()),
                proptest::strategy::Just("x".to_string()),
            ],
            12..=14,
        ),
        cats in proptest::collection::vec("[0-9a-f]{0,8}", 25..=27),
    ) {
        let line = criteo_line(
            label,
            &ints.iter().map(String::as_str).collect::<Vec<_>>(),
            &cats.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        legacy_matches_old(&Schema::criteo(), &line);
    }

    /// Two labels and a weight column anywhere between the features: the parser reads
    /// them as the column-by-column reference does (bad values drop the row).
    #[test]
    fn labels_and_weights_match_the_reference(
        click in proptest::sample::select(vec!["0", "1", "1.0", "2", ""]),
        conv in proptest::sample::select(vec!["0", "1", "0.0", "x", ""]),
        w in proptest::prop_oneof![
            proptest::strategy::Just(String::new()),
            (0f32..100.0).prop_map(|v| v.to_string()),
            proptest::sample::select(vec!["-1", "nan", "x", "1e-3", "0"]).prop_map(String::from),
        ],
        user in "[a-z]{0,3}",
        x in "-?[0-9]{0,3}",
        order in 0usize..3,
    ) {
        let mut s = two_label_schema();
        // move the weight column around
        let wcol = s.columns.remove(2);
        s.columns.insert([0, 2, 5][order].min(s.columns.len()), wcol);
        let mut values: Vec<String> = Vec::new();
        for c in &s.columns {
            values.push(match c.name.as_str() {
                "click" => click.to_string(),
                "conversion" => conv.to_string(),
                "w" => w.clone(),
                "user" => user.clone(),
                _ => x.clone(),
            });
        }
        legacy_matches_old(&s, values.join("\t").as_bytes());
    }

    /// Multi-sparse bags with empty items: the legacy plan's bag is the old one.
    #[test]
    fn legacy_bags_are_unchanged(tags in "[ab|]{0,12}", city in "[a-z]{0,3}") {
        let s = Schema {
            columns: vec![
                Column::new("y", ColumnKind::Label),
                Column::new("tags", ColumnKind::MultiSparse { separator: '|' }),
                Column::new("x", ColumnKind::Dense),
                Column::new("city", ColumnKind::Sparse),
            ],
            separator: ',',
            header: false,
        };
        legacy_matches_old(&s, format!("1,{tags},3,{city}").as_bytes());
    }

    /// Any sequence keeps its last `max_len` non-empty items, oldest first.
    #[test]
    fn sequences_keep_the_most_recent(
        items in proptest::collection::vec("[a-c]{0,2}", 0..12),
        max_len in 1usize..6,
    ) {
        let s = rich_schema();
        let plan = InputPlan {
            slots: vec![slot("hist", 3, 1, SlotKind::Sequence { max_len })],
            dense: vec![],
        };
        let p = LineParser::with_plan(&s, &plan);
        let mut b = p.builder(1);
        let line = format!("0\t\t\t{}\t\t", items.join("|"));
        p.parse_line(line.as_bytes(), &mut b).unwrap();
        let got = b.take().ids;
        let kept: Vec<&String> = items.iter().filter(|v| !v.is_empty()).collect();
        let want: Vec<u64> = if kept.is_empty() {
            vec![missing_id(1)]
        } else {
            kept[kept.len().saturating_sub(max_len)..]
                .iter()
                .map(|v| feature_id(1, v.as_bytes()))
                .collect()
        };
        proptest::prop_assert_eq!(got, want);
    }

    /// Weighted items: any finite weight is read back (as f32), every id has one.
    #[test]
    fn weights_round_trip(ws in proptest::collection::vec(-1e3f32..1e3, 1..6)) {
        let items: Vec<String> = ws.iter().enumerate().map(|(i, w)| format!("t{i}:{w}")).collect();
        let b = parse_rich(&format!("0\tu\t{}\t\t\t", items.join("|"))).unwrap();
        proptest::prop_assert_eq!(b.weights_of(0, 0).unwrap(), &ws[..]);
    }
}

#[test]
fn the_log1p_table_gives_the_computed_bits() {
    let table = super::dense::Log1pTable::new();
    let bits = |v: Option<f32>| v.map(f32::to_bits);
    let mut xs: Vec<f64> = (0..3000).map(f64::from).collect();
    xs.extend((0..3000).map(|i| -f64::from(i)));
    xs.extend([
        -0.0,
        0.5,
        1023.5,
        1023.999,
        1024.0,
        1e300,
        -1e300,
        f64::NAN,
        f64::INFINITY,
    ]);
    xs.extend([f64::from_bits(1), f64::MIN_POSITIVE, 2.0f64.powi(60)]);
    let standardize = DenseTransform::Standardize {
        mean: 2.0,
        std: 3.0,
    };
    for x in xs {
        for t in [DenseTransform::Log1p, standardize] {
            assert_eq!(
                bits(table.dense_value(t, x)),
                bits(super::dense::dense_value(t, x)),
                "{t:?} of {x}"
            );
        }
    }
    // And through a line: "-0" parses as the integer 0, a float text "-0.0" keeps its sign.
    let schema = Schema::criteo();
    let cats = vec![""; 26];
    let mut ints = vec!["0"; 13];
    ints[0] = "-0.0";
    ints[1] = "1023";
    ints[2] = "1024";
    let b = parse(&schema, &criteo_line("1", &ints, &cats)).unwrap();
    assert_eq!(b.dense[0].to_bits(), (-0.0f32).to_bits());
    assert_eq!(b.dense[1], log_transform(1023.0));
    assert_eq!(b.dense[2], log_transform(1024.0));
}

//! Line parser: one text line -> one row appended to a [`BatchBuilder`], following an
//! [`InputPlan`] (which columns become which slots and dense inputs).
//!
//! A line is cut into its columns, then [`LineParser::parse_values`] makes the row from the
//! per-column values; serving requests call that too, with values taken from JSON, so a request
//! scores exactly as the same line would have trained.
//!
//! Hot path: no allocation per line or field (up to [`STACK_COLUMNS`] columns), `memchr` for
//! separators, integers parsed by hand, values hashed in place.

use std::fmt;

use memchr::memchr;

use crate::batch::BatchBuilder;
use crate::features::{DenseTransform, InputPlan, SlotKind};
use crate::ids::{feature_id, missing_id};
use crate::schema::{ColumnKind, Schema};

/// Longest accepted line in bytes (without the line end).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Largest accepted magnitude of a raw dense value (2^50 ~ 1.1e15: above any count or price;
/// a larger value is a unit error or garbage). A dense value beyond it, or one whose
/// transformed value is not a finite f32, makes its line malformed (`BadDense`, counted in
/// `bad_lines`) rather than training the model towards saturation.
pub const MAX_ABS_DENSE: f64 = (1u64 << 50) as f64;

/// Why a line was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadLine {
    /// Fewer columns than the schema has.
    TooFewColumns {
        /// Columns found.
        found: usize,
        /// Columns expected.
        expected: usize,
    },
    /// More columns than the schema has.
    TooManyColumns {
        /// Columns found.
        found: usize,
        /// Columns expected.
        expected: usize,
    },
    /// A label is not 0/1.
    BadLabel {
        /// Label column name.
        column: String,
    },
    /// A dense value is not a finite number, or its magnitude exceeds [`MAX_ABS_DENSE`].
    BadDense {
        /// Dense column name.
        column: String,
    },
    /// A weighted bag item's weight (after the last weight separator) is not a finite number.
    BadWeight {
        /// Multi-sparse column name.
        column: String,
    },
    /// The sample weight is not a finite number `>= 0` (see [`parse_sample_weight`]).
    BadSampleWeight {
        /// Weight column name.
        column: String,
    },
    /// The line is not valid UTF-8.
    InvalidUtf8,
    /// The line is longer than [`MAX_LINE_BYTES`].
    TooLong {
        /// Length in bytes (at least).
        len: usize,
    },
    /// A stream record (Kafka) holds a newline: one record must be one line.
    MultiLine,
}

impl fmt::Display for BadLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadLine::TooFewColumns { found, expected } => {
                write!(f, "too few columns ({found}, expected {expected})")
            }
            BadLine::TooManyColumns { found, expected } => {
                write!(f, "too many columns ({found}, expected {expected})")
            }
            BadLine::BadLabel { column } => write!(f, "label {column:?} is not 0 or 1"),
            BadLine::BadDense { column } => write!(f, "dense value {column:?} is not a number"),
            BadLine::BadWeight { column } => write!(
                f,
                "an item of {column:?} has a weight that is not a finite number"
            ),
            BadLine::BadSampleWeight { column } => {
                write!(f, "sample weight {column:?} is not a finite number >= 0")
            }
            BadLine::InvalidUtf8 => write!(f, "invalid UTF-8"),
            BadLine::MultiLine => write!(f, "a record holds a newline (one record is one line)"),
            BadLine::TooLong { len } => {
                write!(f, "line of {len} bytes exceeds {MAX_LINE_BYTES} bytes")
            }
        }
    }
}

/// Columns a line may have before splitting it needs a heap buffer.
pub const STACK_COLUMNS: usize = 64;

/// What a slot makes of its column's value.
#[derive(Clone, Debug)]
enum SlotOp {
    Id,
    Bag { sep: u8 },
    WeightedBag { sep: u8, weight_sep: u8 },
    Sequence { sep: u8, max_len: usize },
    Buckets { boundaries: Box<[f64]> },
}

#[derive(Clone, Debug)]
struct SlotStep {
    column: usize,
    tag: u8,
    op: SlotOp,
}

#[derive(Clone, Debug)]
struct DenseStep {
    column: usize,
    transform: DenseTransform,
}

/// Parses lines of one schema into the rows of one input plan.
#[derive(Clone, Debug)]
pub struct LineParser {
    slots: Vec<SlotStep>,
    dense: Vec<DenseStep>,
    /// The label columns, in column order.
    labels: Vec<usize>,
    /// The sample-weight column.
    weight: Option<usize>,
    names: Vec<String>,
    sep: u8,
    /// Separator inside each column's value (the line separator for single values).
    value_seps: Vec<u8>,
    weighted: bool,
}

impl LineParser {
    /// A parser for `schema` (which must have passed [`Schema::validate`]) with its legacy
    /// plan ([`InputPlan::legacy`]): every sparse column a field tagged with its index among the
    /// fields, every dense column `log1p`.
    pub fn new(schema: &Schema) -> LineParser {
        Self::with_plan(schema, &InputPlan::legacy(schema))
    }

    /// A parser for `schema` with `plan` (`None`: the legacy plan).
    pub fn for_plan(schema: &Schema, plan: Option<&InputPlan>) -> LineParser {
        match plan {
            Some(p) => Self::with_plan(schema, p),
            None => Self::new(schema),
        }
    }

    /// A parser making the rows of `plan` (which must have passed [`InputPlan::validate`]
    /// against `schema`) from lines of `schema`.
    pub fn with_plan(schema: &Schema, plan: &InputPlan) -> LineParser {
        let separator = |column: usize| match schema.columns[column].kind {
            ColumnKind::MultiSparse { separator } => separator as u8,
            _ => schema.separator as u8,
        };
        let slots = plan
            .slots
            .iter()
            .map(|s| SlotStep {
                column: s.column,
                tag: s.tag,
                op: match &s.kind {
                    SlotKind::Id => SlotOp::Id,
                    SlotKind::Bag {
                        weighted: false, ..
                    } => SlotOp::Bag {
                        sep: separator(s.column),
                    },
                    SlotKind::Bag {
                        weighted: true,
                        weight_separator,
                        ..
                    } => SlotOp::WeightedBag {
                        sep: separator(s.column),
                        weight_sep: *weight_separator,
                    },
                    SlotKind::Sequence { max_len } => SlotOp::Sequence {
                        sep: separator(s.column),
                        max_len: *max_len,
                    },
                    SlotKind::Buckets { boundaries } => SlotOp::Buckets {
                        boundaries: boundaries.clone().into_boxed_slice(),
                    },
                },
            })
            .collect();
        let dense = plan
            .dense
            .iter()
            .map(|d| DenseStep {
                column: d.column,
                transform: d.transform,
            })
            .collect();
        LineParser {
            slots,
            dense,
            labels: (0..schema.columns.len())
                .filter(|&c| schema.columns[c].kind == ColumnKind::Label)
                .collect(),
            weight: schema.weight_index(),
            names: schema.columns.iter().map(|c| c.name.clone()).collect(),
            sep: schema.separator as u8,
            value_seps: (0..schema.columns.len()).map(separator).collect(),
            weighted: plan.weighted(),
        }
    }

    /// Sparse fields (the plan's slots) per row.
    pub fn num_fields(&self) -> usize {
        self.slots.len()
    }

    /// Dense values (the plan's dense inputs) per row.
    pub fn num_dense(&self) -> usize {
        self.dense.len()
    }

    /// Columns of a line.
    pub fn num_columns(&self) -> usize {
        self.names.len()
    }

    /// Index of the first label column.
    pub fn label_column(&self) -> usize {
        self.labels.first().copied().unwrap_or(0)
    }

    /// Indexes of the label columns, in column order (a batch's labels per row).
    pub fn label_columns(&self) -> &[usize] {
        &self.labels
    }

    /// Labels per row (the builder's and batches' `num_labels`).
    pub fn num_labels(&self) -> usize {
        self.labels.len().max(1)
    }

    /// Index of the sample-weight column, if the schema has one (its rows then carry
    /// `sample_weights`).
    pub fn weight_column(&self) -> Option<usize> {
        self.weight
    }

    /// Column names of a line.
    pub fn column_names(&self) -> &[String] {
        &self.names
    }

    /// The separator between columns of a line.
    pub fn separator(&self) -> u8 {
        self.sep
    }

    /// The separator between the values of a multi-valued column `column` (the line separator
    /// for other columns).
    pub fn value_separator(&self, column: usize) -> u8 {
        self.value_seps[column]
    }

    /// The columns [`LineParser::parse_values`] asks for (the labels, the sample weight, the
    /// plan's dense inputs and slots), ascending, each once.
    pub fn used_columns(&self) -> Vec<usize> {
        let mut cols: Vec<usize> = self
            .labels
            .iter()
            .copied()
            .chain(self.weight)
            .chain(self.dense.iter().map(|d| d.column))
            .chain(self.slots.iter().map(|s| s.column))
            .collect();
        cols.sort_unstable();
        cols.dedup();
        cols
    }

    /// True when the rows carry item weights (some slot is a weighted bag).
    pub fn is_weighted(&self) -> bool {
        self.weighted
    }

    /// A builder for this parser's rows: `num_labels` labels per row, sample-weighted when
    /// the schema has a weight column, weighted when the plan is.
    pub fn builder(&self, capacity: usize) -> BatchBuilder {
        BatchBuilder::with_weights(self.num_fields(), self.num_dense(), capacity, self.weighted)
            .with_labels(self.num_labels())
            .with_sample_weights(self.weight.is_some())
    }

    /// Parses `line` (without `\n`; a trailing `\r` is dropped) and appends it as a row.
    /// On error nothing is appended.
    pub fn parse_line(&self, line: &[u8], out: &mut BatchBuilder) -> Result<(), BadLine> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > MAX_LINE_BYTES {
            return Err(BadLine::TooLong { len: line.len() });
        }
        if std::str::from_utf8(line).is_err() {
            return Err(BadLine::InvalidUtf8);
        }
        let n = self.names.len();
        let mut stack = [(0u32, 0u32); STACK_COLUMNS];
        let mut heap = Vec::new();
        let cols: &mut [(u32, u32)] = if n <= STACK_COLUMNS {
            &mut stack[..n]
        } else {
            heap.resize(n, (0, 0));
            &mut heap
        };
        self.split(line, cols)?;
        self.parse_values(
            |c| {
                let (a, b) = cols[c];
                Some(&line[a as usize..b as usize])
            },
            out,
        )
    }

    /// Cuts `line` into exactly `cols.len()` columns (byte ranges).
    #[inline]
    fn split(&self, line: &[u8], cols: &mut [(u32, u32)]) -> Result<(), BadLine> {
        let expected = cols.len();
        let mut start = 0usize;
        for (i, col) in cols.iter_mut().enumerate().take(expected - 1) {
            match memchr(self.sep, &line[start..]) {
                Some(p) => {
                    *col = (start as u32, (start + p) as u32);
                    start += p + 1;
                }
                None => {
                    return Err(BadLine::TooFewColumns {
                        found: i + 1,
                        expected,
                    })
                }
            }
        }
        let rest = &line[start..];
        if memchr(self.sep, rest).is_some() {
            let extra = memchr::memchr_iter(self.sep, rest).count();
            return Err(BadLine::TooManyColumns {
                found: expected + extra,
                expected,
            });
        }
        cols[expected - 1] = (start as u32, line.len() as u32);
        Ok(())
    }

    /// Appends the row whose column `c` holds `value_of(c)` (`None`: missing, as an empty
    /// value) and returns `Ok`, or appends nothing and says why the row is bad. The label
    /// columns are read (each must be 0 or 1) and the sample weight (a finite number `>= 0`,
    /// empty is 1), then the dense inputs and the slots in plan order; columns no feature
    /// reads are not asked for. `out` must be this parser's [`LineParser::builder`] (or
    /// shaped like it). The line path and serving requests share
    /// this code.
    pub fn parse_values<'v>(
        &self,
        mut value_of: impl FnMut(usize) -> Option<&'v [u8]>,
        out: &mut BatchBuilder,
    ) -> Result<(), BadLine> {
        out.begin_row();
        let r = self.fill_row(&mut value_of, out);
        match r {
            Ok(()) => out.end_row(),
            Err(_) => out.rollback(),
        }
        r
    }

    #[inline]
    fn fill_row<'v>(
        &self,
        value_of: &mut impl FnMut(usize) -> Option<&'v [u8]>,
        out: &mut BatchBuilder,
    ) -> Result<(), BadLine> {
        for &c in &self.labels {
            match parse_label(value_of(c).unwrap_or_default()) {
                Some(l) => out.push_label(l),
                None => {
                    return Err(BadLine::BadLabel {
                        column: self.names[c].clone(),
                    })
                }
            }
        }
        if let Some(c) = self.weight {
            match parse_sample_weight(value_of(c).unwrap_or_default()) {
                Some(w) => out.push_sample_weight(w),
                None => {
                    return Err(BadLine::BadSampleWeight {
                        column: self.names[c].clone(),
                    })
                }
            }
        }
        for d in &self.dense {
            let value = value_of(d.column).unwrap_or_default();
            let x = if value.is_empty() {
                0.0
            } else {
                match parse_number(value).and_then(|x| dense_value(d.transform, x)) {
                    Some(x) => x,
                    None => return Err(self.bad_dense(d.column)),
                }
            };
            out.push_dense(x);
        }
        for s in &self.slots {
            let value = value_of(s.column).unwrap_or_default();
            let tag = s.tag;
            match &s.op {
                SlotOp::Id => out.push_id(if value.is_empty() {
                    missing_id(tag)
                } else {
                    feature_id(tag, value)
                }),
                SlotOp::Bag { sep } => {
                    let before = out.num_ids();
                    for v in value.split(|b| b == sep) {
                        if !v.is_empty() {
                            out.push_id(feature_id(tag, v));
                        }
                    }
                    if out.num_ids() == before {
                        out.push_id(missing_id(tag));
                    }
                }
                SlotOp::WeightedBag { sep, weight_sep } => {
                    let before = out.num_ids();
                    for item in value.split(|b| b == sep) {
                        let (v, w) = match memchr::memrchr(*weight_sep, item) {
                            Some(p) => match parse_weight(&item[p + 1..]) {
                                Some(w) => (&item[..p], w),
                                None => {
                                    return Err(BadLine::BadWeight {
                                        column: self.names[s.column].clone(),
                                    })
                                }
                            },
                            None => (item, 1.0),
                        };
                        if !v.is_empty() {
                            out.push_weighted_id(feature_id(tag, v), w);
                        }
                    }
                    if out.num_ids() == before {
                        out.push_id(missing_id(tag));
                    }
                }
                SlotOp::Sequence { sep, max_len } => {
                    // Newest first (from the end), then reversed: oldest first.
                    let before = out.num_ids();
                    for v in value
                        .rsplit(|b| b == sep)
                        .filter(|v| !v.is_empty())
                        .take(*max_len)
                    {
                        out.push_id(feature_id(tag, v));
                    }
                    if out.num_ids() == before {
                        out.push_id(missing_id(tag));
                    } else {
                        out.reverse_ids_from(before);
                    }
                }
                SlotOp::Buckets { boundaries } => {
                    let id = if value.is_empty() {
                        missing_id(tag)
                    } else {
                        match parse_number(value) {
                            Some(x) => bucket_id(tag, boundaries, x),
                            None => return Err(self.bad_dense(s.column)),
                        }
                    };
                    out.push_id(id);
                }
            }
            out.end_field();
        }
        Ok(())
    }

    #[cold]
    fn bad_dense(&self, column: usize) -> BadLine {
        BadLine::BadDense {
            column: self.names[column].clone(),
        }
    }
}

/// Id of value `x` cut at `boundaries` (ascending): bucket `i` = the number of boundaries
/// `<= x`, id `(tag << 56) | (i + 1)` (hash part 0 stays the missing id).
#[inline]
pub fn bucket_id(tag: u8, boundaries: &[f64], x: f64) -> u64 {
    let i = boundaries.partition_point(|&b| b <= x) as u64;
    missing_id(tag) | (i + 1)
}

/// Parses an item weight: a finite float.
#[inline]
fn parse_weight(s: &[u8]) -> Option<f32> {
    let w: f32 = std::str::from_utf8(s).ok()?.parse().ok()?;
    w.is_finite().then_some(w)
}

/// Parses a sample weight: a number that is finite (as an `f32`) and `>= 0` (`1`, `0.5`,
/// `2e-1`); the empty value is 1. `-0` is 0.
#[inline]
pub fn parse_sample_weight(s: &[u8]) -> Option<f32> {
    match s {
        b"" | b"1" => Some(1.0),
        b"0" => Some(0.0),
        _ => {
            // Parsed as f32 directly: the Parquet writer stores this f32, whose text reads
            // back as the same value.
            let w: f32 = std::str::from_utf8(s).ok()?.parse().ok()?;
            (w.is_finite() && w >= 0.0).then_some(w.abs())
        }
    }
}

/// Parses a label: `0`, `1`, or any number equal to 0 or 1 (`0.0`, `1.0`).
#[inline]
pub fn parse_label(s: &[u8]) -> Option<f32> {
    match s {
        b"0" => Some(0.0),
        b"1" => Some(1.0),
        _ => {
            let v: f64 = std::str::from_utf8(s).ok()?.parse().ok()?;
            if v == 0.0 {
                Some(0.0)
            } else if v == 1.0 {
                Some(1.0)
            } else {
                None
            }
        }
    }
}

/// `transform(x)` when `|x| <= MAX_ABS_DENSE` and the result is a finite f32.
#[inline]
fn dense_value(transform: DenseTransform, x: f64) -> Option<f32> {
    if x.abs() > MAX_ABS_DENSE {
        return None;
    }
    let v = transform.apply(x);
    v.is_finite().then_some(v)
}

/// Parses a dense value and applies [`log_transform`]; empty is missing (0).
/// Accepts integers and finite floats of magnitude up to [`MAX_ABS_DENSE`]; anything else is
/// `None`.
#[inline]
pub fn parse_dense(s: &[u8]) -> Option<f32> {
    if s.is_empty() {
        return Some(0.0);
    }
    parse_number(s).and_then(|x| dense_value(DenseTransform::Log1p, x))
}

/// Parses a non-empty raw number: an integer (fast path) or a finite float; anything else
/// (and the empty value) is `None`.
#[inline]
pub fn parse_number(s: &[u8]) -> Option<f64> {
    let (neg, digits) = match s.first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if !digits.is_empty() && digits.len() <= 18 {
        let mut v: i64 = 0;
        let mut all_digits = true;
        for &b in digits {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                all_digits = false;
                break;
            }
            v = v * 10 + d as i64;
        }
        if all_digits {
            let x = if neg { -v } else { v };
            return Some(x as f64);
        }
    }
    let v: f64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::log_transform;
    use crate::schema::Column;

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
}

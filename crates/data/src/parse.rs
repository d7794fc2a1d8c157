//! Line parser: one text line -> one row appended to a [`BatchBuilder`].
//!
//! Hot path: no allocation per line or field, `memchr` for separators, integers parsed
//! by hand, values hashed in place.

use std::fmt;

use memchr::memchr;

use crate::batch::{log_transform, BatchBuilder};
use crate::ids::{feature_id, missing_id};
use crate::schema::{ColumnKind, Schema};

/// Longest accepted line in bytes (without the line end).
pub const MAX_LINE_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
enum Op {
    Label,
    Dense,
    Sparse(u8),
    Multi(u8, u8),
    Ignore,
}

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
    /// The label is not 0/1.
    BadLabel {
        /// Label column name.
        column: String,
    },
    /// A dense value is not a finite number.
    BadDense {
        /// Dense column name.
        column: String,
    },
    /// The line is not valid UTF-8.
    InvalidUtf8,
    /// The line is longer than [`MAX_LINE_BYTES`].
    TooLong {
        /// Length in bytes (at least).
        len: usize,
    },
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
            BadLine::InvalidUtf8 => write!(f, "invalid UTF-8"),
            BadLine::TooLong { len } => {
                write!(f, "line of {len} bytes exceeds {MAX_LINE_BYTES} bytes")
            }
        }
    }
}

/// Parses lines of one schema.
#[derive(Clone, Debug)]
pub struct LineParser {
    ops: Vec<Op>,
    names: Vec<String>,
    sep: u8,
    num_fields: usize,
    num_dense: usize,
}

impl LineParser {
    /// A parser for `schema` (which must have passed [`Schema::validate`]).
    pub fn new(schema: &Schema) -> LineParser {
        let mut field = 0u8;
        let ops = schema
            .columns
            .iter()
            .map(|c| match c.kind {
                ColumnKind::Label => Op::Label,
                ColumnKind::Dense => Op::Dense,
                ColumnKind::Ignore => Op::Ignore,
                ColumnKind::Sparse => {
                    field = field.wrapping_add(1);
                    Op::Sparse(field - 1)
                }
                ColumnKind::MultiSparse { separator } => {
                    field = field.wrapping_add(1);
                    Op::Multi(field - 1, separator as u8)
                }
            })
            .collect();
        LineParser {
            ops,
            names: schema.columns.iter().map(|c| c.name.clone()).collect(),
            sep: schema.separator as u8,
            num_fields: schema.num_fields(),
            num_dense: schema.num_dense(),
        }
    }

    /// Sparse fields per row.
    pub fn num_fields(&self) -> usize {
        self.num_fields
    }

    /// Dense values per row.
    pub fn num_dense(&self) -> usize {
        self.num_dense
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
        out.begin_row();
        let r = self.parse_columns(line, out);
        match r {
            Ok(()) => out.end_row(),
            Err(_) => out.rollback(),
        }
        r
    }

    fn parse_columns(&self, line: &[u8], out: &mut BatchBuilder) -> Result<(), BadLine> {
        let expected = self.ops.len();
        let mut rest = line;
        for (i, op) in self.ops.iter().enumerate() {
            let value = if i + 1 == expected {
                if let Some(_p) = memchr(self.sep, rest) {
                    let extra = memchr::memchr_iter(self.sep, rest).count();
                    return Err(BadLine::TooManyColumns {
                        found: expected + extra,
                        expected,
                    });
                }
                rest
            } else {
                match memchr(self.sep, rest) {
                    Some(p) => {
                        let v = &rest[..p];
                        rest = &rest[p + 1..];
                        v
                    }
                    None => {
                        return Err(BadLine::TooFewColumns {
                            found: i + 1,
                            expected,
                        })
                    }
                }
            };
            match *op {
                Op::Label => match parse_label(value) {
                    Some(l) => out.push_label(l),
                    None => {
                        return Err(BadLine::BadLabel {
                            column: self.names[i].clone(),
                        })
                    }
                },
                Op::Dense => match parse_dense(value) {
                    Some(x) => out.push_dense(x),
                    None => {
                        return Err(BadLine::BadDense {
                            column: self.names[i].clone(),
                        })
                    }
                },
                Op::Sparse(f) => {
                    out.push_id(if value.is_empty() {
                        missing_id(f)
                    } else {
                        feature_id(f, value)
                    });
                    out.end_field();
                }
                Op::Multi(f, sep) => {
                    let before = out.num_ids();
                    for v in value.split(|&b| b == sep) {
                        if !v.is_empty() {
                            out.push_id(feature_id(f, v));
                        }
                    }
                    if out.num_ids() == before {
                        out.push_id(missing_id(f));
                    }
                    out.end_field();
                }
                Op::Ignore => {}
            }
        }
        Ok(())
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

/// Parses a dense value and applies [`log_transform`]; empty is missing (0).
/// Accepts integers and finite floats; anything else is `None`.
#[inline]
pub fn parse_dense(s: &[u8]) -> Option<f32> {
    if s.is_empty() {
        return Some(0.0);
    }
    let (neg, digits) = match s[0] {
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
            return Some(log_transform(x as f64));
        }
    }
    let v: f64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    v.is_finite().then(|| log_transform(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Column;

    fn parse(schema: &Schema, line: &[u8]) -> Result<crate::Batch, BadLine> {
        let p = LineParser::new(schema);
        let mut b = BatchBuilder::new(p.num_fields(), p.num_dense(), 1);
        p.parse_line(line, &mut b)?;
        let batch = b.take();
        batch.check().unwrap();
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
        let big = parse_dense(b"12345678901234567890123").unwrap();
        assert!((big - log_transform(1.2345678901234568e22)).abs() < 1e-5);
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
}

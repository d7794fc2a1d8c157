//! Arrow record batches handed in from outside the reader (the Python package's DataFrames,
//! RecordBatches and Tables) -> the rows a file of the same values makes.
//!
//! Columns are found by the schema's names (extra columns are ignored, their order does not
//! matter); each value is written as the text its line would hold and the row is made by
//! [`LineParser::parse_values`], as for a Parquet file (see [`crate::parquet`]): the same ids,
//! dense transforms, limits and bad-row rules as text. The Arrow buffers are read in place.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{Array, RecordBatch};

use super::arrow_text::{text_values, TextValues};
use super::text::row_text;
use crate::batch::{Batch, BatchBuilder};
use crate::error::DataError;
use crate::parse::{BadLine, LineParser};
use crate::schema::{ColumnKind, Schema};
use crate::stats::{account_lines, too_many_bad, ReadStats};

/// Makes rows of one schema and input plan from record batches.
#[derive(Clone, Debug)]
pub struct RecordRows {
    parser: LineParser,
    /// Per line column: the value a missing column gets (scoring: labels `0`, the sample
    /// weight empty); `None`: the column must be there when the plan reads it.
    placeholder: Vec<Option<&'static [u8]>>,
}

/// What [`RecordRows::append`] made of a record batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rows {
    /// Rows appended.
    pub good: usize,
    /// Indices (in the record batch) of the rows that were bad, ascending.
    pub bad: Vec<usize>,
}

impl RecordRows {
    /// Rows for training or evaluation: every column the plan reads (labels included) must be
    /// in each record batch. `parser` is the job's ([`LineParser::for_plan`]).
    pub fn new(parser: LineParser) -> RecordRows {
        let placeholder = vec![None; parser.num_columns()];
        RecordRows {
            parser,
            placeholder,
        }
    }

    /// Rows for scoring: label and sample-weight columns of `schema` may be absent (their
    /// values are not used), as in a serving request.
    pub fn for_scoring(parser: LineParser, schema: &Schema) -> RecordRows {
        let placeholder = schema
            .columns
            .iter()
            .map(|c| match c.kind {
                ColumnKind::Label => Some(&b"0"[..]),
                ColumnKind::Weight => Some(&b""[..]),
                _ => None,
            })
            .collect();
        RecordRows {
            parser,
            placeholder,
        }
    }

    /// The line parser rows are made with.
    pub fn parser(&self) -> &LineParser {
        &self.parser
    }

    /// Appends the good rows of `batch` to `out` (this parser's [`LineParser::builder`]);
    /// `bad` hears of each bad row (its index in `batch`, why, and its projected values joined
    /// by the line separator). Fails, appending nothing, when a column the plan reads is
    /// missing (and has no placeholder) or of a type that is not read.
    pub fn append(
        &self,
        batch: &RecordBatch,
        out: &mut BatchBuilder,
        mut bad: impl FnMut(usize, &BadLine, &[u8]),
    ) -> Result<Rows, DataError> {
        let names = self.parser.column_names();
        let schema = batch.schema();
        // Per line column: where its value comes from.
        let mut source: Vec<Option<Source<'_>>> = (0..names.len()).map(|_| None).collect();
        let mut arrays: Vec<Box<dyn TextValues + '_>> = Vec::new();
        for c in self.parser.used_columns() {
            let name = &names[c];
            match schema.index_of(name) {
                Ok(i) => {
                    let a: &dyn Array = batch.column(i).as_ref();
                    let values = text_values(a, self.parser.value_separator(c))
                        .map_err(|e| DataError::Frame(format!("column {name:?}: {e}")))?;
                    source[c] = Some(Source::Column(arrays.len()));
                    arrays.push(values);
                }
                Err(_) => match self.placeholder[c] {
                    Some(p) => source[c] = Some(Source::Fixed(p)),
                    None => {
                        let have: Vec<&str> =
                            schema.fields().iter().map(|f| f.name().as_str()).collect();
                        return Err(DataError::Frame(format!(
                            "no column {name:?} (the job reads it); the frame has {have:?}"
                        )));
                    }
                },
            }
        }
        let mut rows = Rows::default();
        let mut text = Vec::new();
        let mut spans = vec![(0usize, 0usize); arrays.len()];
        for r in 0..batch.num_rows() {
            text.clear();
            for (span, col) in spans.iter_mut().zip(&arrays) {
                let start = text.len();
                col.write(r, &mut text);
                *span = (start, text.len());
            }
            let value_of = |c: usize| match source[c] {
                Some(Source::Column(k)) => Some(&text[spans[k].0..spans[k].1]),
                Some(Source::Fixed(p)) => Some(p),
                None => None,
            };
            match self.parser.parse_values(value_of, out) {
                Ok(()) => rows.good += 1,
                Err(reason) => {
                    bad(
                        r,
                        &reason,
                        &row_text(&text, &spans, self.parser.separator()),
                    );
                    rows.bad.push(r);
                }
            }
        }
        Ok(rows)
    }
}

/// The batches of record batches handed in, one after another: rows cut into batches of
/// `batch_size` across record batches (only the last may be smaller), as a reader of a file
/// of the same rows cuts them, so training on either is the same computation. Bad rows are
/// counted and reported (as `frame N:ROW`, both 1-based) and the job's `max_bad_line_ratio`
/// applies, as for files; `max_rows` stops the stream.
pub struct FrameBatches<I> {
    rows: RecordRows,
    frames: I,
    builder: BatchBuilder,
    /// Rows made and not handed out yet: `pending.rows - at` from row `at` on.
    pending: Batch,
    at: usize,
    batch_size: usize,
    max_ratio: f64,
    max_rows: Option<u64>,
    stats: Arc<ReadStats>,
    frame: u64,
    handed: u64,
    done: bool,
}

impl<I: Iterator<Item = Result<RecordBatch, DataError>>> FrameBatches<I> {
    /// Batches of `frames` made by `rows`, cut as `batch_size`, with the bad-row ratio and row
    /// limit of a reader (`max_ratio`, `max_rows`).
    pub fn new(
        rows: RecordRows,
        frames: I,
        batch_size: usize,
        max_ratio: f64,
        max_rows: Option<u64>,
    ) -> Self {
        let batch_size = batch_size.max(1);
        let mut builder = rows.parser().builder(batch_size);
        let pending = builder.take();
        FrameBatches {
            rows,
            frames,
            builder,
            pending,
            at: 0,
            batch_size,
            max_ratio,
            max_rows,
            stats: Arc::default(),
            frame: 0,
            handed: 0,
            done: false,
        }
    }

    /// The live counters (rows handed out, rows seen, bad rows and the first few reported).
    pub fn stats(&self) -> Arc<ReadStats> {
        Arc::clone(&self.stats)
    }

    /// The next batch: `batch_size` rows, or (`all`) whatever is left; within `max_rows`.
    fn cut(&mut self, all: bool) -> Option<Batch> {
        let left = self
            .max_rows
            .map_or(u64::MAX, |m| m.saturating_sub(self.handed));
        let have = self.pending.rows - self.at;
        let n = have.min(self.batch_size).min(left as usize);
        if n == 0 || (!all && n < self.batch_size && (left as usize) > n) {
            return None;
        }
        let batch = self.pending.slice(self.at..self.at + n);
        self.at += n;
        self.handed += n as u64;
        self.stats.add_rows(n as u64);
        Some(batch)
    }

    /// Moves the rows made from the last frame behind the pending ones.
    fn take_made(&mut self) {
        let made = self.builder.take();
        if self.at == self.pending.rows {
            self.pending = made;
        } else {
            let mut rest = self.pending.slice(self.at..self.pending.rows);
            rest.append_rows(&made, 0..made.rows);
            self.pending = rest;
        }
        self.at = 0;
    }
}

impl<I: Iterator<Item = Result<RecordBatch, DataError>>> Iterator for FrameBatches<I> {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Result<Batch, DataError>> {
        loop {
            if let Some(b) = self.cut(self.done) {
                return Some(Ok(b));
            }
            if self.done {
                return None;
            }
            let frame = match self.frames.next() {
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                None => {
                    self.done = true;
                    let st = &self.stats;
                    let max = self.max_ratio;
                    if let Some(e) = too_many_bad(st.bad_lines(), st.lines_seen(), max, st) {
                        return Some(Err(e));
                    }
                    continue;
                }
            };
            self.frame += 1;
            let (stats, name) = (&self.stats, PathBuf::from(format!("frame {}", self.frame)));
            let got = self.rows.append(&frame, &mut self.builder, |r, why, text| {
                stats.report_bad(&name, || r as u64 + 1, why, text)
            });
            let got = match got {
                Ok(g) => g,
                Err(e) => {
                    self.done = true;
                    return Some(Err(match e {
                        DataError::Frame(m) => {
                            DataError::Frame(format!("frame {}: {m}", self.frame))
                        }
                        e => e,
                    }));
                }
            };
            let (seen, bad) = ((got.good + got.bad.len()) as u64, got.bad.len() as u64);
            if let Some(e) = account_lines(stats, seen, bad, 0, self.max_ratio) {
                self.done = true;
                return Some(Err(e));
            }
            self.take_made();
        }
    }
}

/// Where a line column's value comes from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// The `k`-th array read.
    Column(usize),
    /// A fixed value (a placeholder for a column scoring does not need).
    Fixed(&'a [u8]),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};

    use super::*;

    fn schema() -> Schema {
        let text = r#"
            separator = "\t"
            columns = [
                { name = "label", kind = "label" },
                { name = "price", kind = "dense" },
                { name = "user", kind = "sparse" },
            ]
        "#;
        let s: Schema = toml::from_str(text).unwrap();
        s.validate().unwrap();
        s
    }

    fn frame(cols: &[(&str, ArrayRef)]) -> RecordBatch {
        RecordBatch::try_from_iter(cols.iter().cloned()).unwrap()
    }

    #[test]
    fn rows_equal_the_lines_of_the_same_values_in_any_column_order() {
        let s = schema();
        let parser = LineParser::new(&s);
        let rows = RecordRows::new(parser.clone());
        let b = frame(&[
            (
                "user",
                Arc::new(StringArray::from(vec![Some("u1"), None, Some("u3")])) as ArrayRef,
            ),
            ("extra", Arc::new(Int64Array::from(vec![7, 8, 9]))),
            ("label", Arc::new(Int64Array::from(vec![1, 0, 1]))),
            (
                "price",
                Arc::new(Float64Array::from(vec![Some(2.5), Some(3.0), None])),
            ),
        ]);
        let mut out = parser.builder(4);
        let got = rows
            .append(&b, &mut out, |_, _, _| panic!("no bad row"))
            .unwrap();
        assert_eq!(
            got,
            Rows {
                good: 3,
                bad: vec![]
            }
        );
        let mut want = parser.builder(4);
        for line in ["1\t2.5\tu1", "0\t3\t", "1\t\tu3"] {
            parser.parse_line(line.as_bytes(), &mut want).unwrap();
        }
        let (got, want) = (out.take(), want.take());
        assert_eq!(got.ids, want.ids);
        assert_eq!(got.dense, want.dense);
        assert_eq!(got.labels, want.labels);
    }

    #[test]
    fn a_missing_column_names_it_and_a_bad_label_is_a_bad_row() {
        let s = schema();
        let parser = LineParser::new(&s);
        let rows = RecordRows::new(parser.clone());
        let b = frame(&[
            ("label", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            ("price", Arc::new(Float64Array::from(vec![1.0, 2.0]))),
        ]);
        let mut out = parser.builder(2);
        let e = rows.append(&b, &mut out, |_, _, _| {}).unwrap_err();
        assert!(e.to_string().contains("no column \"user\""), "{e}");
        let b = frame(&[
            ("label", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            ("price", Arc::new(Float64Array::from(vec![1.0, 2.0]))),
            ("user", Arc::new(StringArray::from(vec!["a", "b"]))),
        ]);
        let mut seen = Vec::new();
        let got = rows
            .append(&b, &mut out, |r, why, text| {
                seen.push((r, why.clone(), String::from_utf8_lossy(text).into_owned()))
            })
            .unwrap();
        assert_eq!(
            got,
            Rows {
                good: 1,
                bad: vec![1]
            }
        );
        assert_eq!(seen[0].0, 1);
        assert!(matches!(seen[0].1, BadLine::BadLabel { .. }));
        assert_eq!(seen[0].2, "2\t2\tb");
    }

    #[test]
    fn frames_are_cut_into_batches_as_a_file_of_their_rows() {
        let s = schema();
        let parser = LineParser::new(&s);
        let frame_of = |from: i64, n: i64| {
            let users: Vec<String> = (from..from + n).map(|i| format!("u{i}")).collect();
            frame(&[
                (
                    "label",
                    Arc::new(Int64Array::from_iter_values(
                        (from..from + n).map(|i| i % 2),
                    )) as ArrayRef,
                ),
                (
                    "price",
                    Arc::new(Float64Array::from_iter_values(
                        (from..from + n).map(|i| i as f64),
                    )),
                ),
                ("user", Arc::new(StringArray::from(users))),
            ])
        };
        let frames = vec![Ok(frame_of(0, 3)), Ok(frame_of(3, 5)), Ok(frame_of(8, 2))];
        let it = FrameBatches::new(
            RecordRows::new(parser.clone()),
            frames.into_iter(),
            4,
            0.0,
            None,
        );
        let stats = it.stats();
        let got: Vec<Batch> = it.collect::<Result<_, _>>().unwrap();
        assert_eq!(got.iter().map(|b| b.rows).collect::<Vec<_>>(), [4, 4, 2]);
        let mut want = parser.builder(10);
        for i in 0..10 {
            parser
                .parse_line(format!("{}\t{i}\tu{i}", i % 2).as_bytes(), &mut want)
                .unwrap();
        }
        let all = Batch::concat(&got);
        let want = want.take();
        assert_eq!(
            (all.ids, all.dense, all.labels),
            (want.ids, want.dense, want.labels)
        );
        assert_eq!(
            (stats.rows(), stats.lines_seen(), stats.bad_lines()),
            (10, 10, 0)
        );

        let frames = vec![Ok(frame_of(0, 3)), Ok(frame_of(3, 5))];
        let it = FrameBatches::new(
            RecordRows::new(parser.clone()),
            frames.into_iter(),
            2,
            0.0,
            Some(5),
        );
        let got: Vec<usize> = it.map(|b| b.unwrap().rows).collect();
        assert_eq!(got, [2, 2, 1]);
    }

    #[test]
    fn too_many_bad_rows_stop_the_frames_and_name_the_first() {
        let s = schema();
        let parser = LineParser::new(&s);
        let b = frame(&[
            ("label", Arc::new(Int64Array::from(vec![1, 7])) as ArrayRef),
            ("price", Arc::new(Float64Array::from(vec![1.0, 2.0]))),
            ("user", Arc::new(StringArray::from(vec!["a", "b"]))),
        ]);
        let it = FrameBatches::new(
            RecordRows::new(parser),
            vec![Ok(b)].into_iter(),
            8,
            0.1,
            None,
        );
        let e = it.collect::<Result<Vec<_>, _>>().unwrap_err();
        assert!(
            matches!(
                e,
                DataError::TooManyBadLines {
                    bad: 1,
                    seen: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("frame 1:2: label"), "{e}");
    }

    #[test]
    fn scoring_needs_no_label_column() {
        let s = schema();
        let parser = LineParser::new(&s);
        let rows = RecordRows::for_scoring(parser.clone(), &s);
        let b = frame(&[
            ("price", Arc::new(Float64Array::from(vec![1.0])) as ArrayRef),
            ("user", Arc::new(StringArray::from(vec!["a"]))),
        ]);
        let mut out = parser.builder(1);
        assert_eq!(rows.append(&b, &mut out, |_, _, _| {}).unwrap().good, 1);
        let b = frame(&[("user", Arc::new(StringArray::from(vec!["a"])) as ArrayRef)]);
        let e = rows.append(&b, &mut out, |_, _, _| {}).unwrap_err();
        assert!(e.to_string().contains("no column \"price\""), "{e}");
    }
}

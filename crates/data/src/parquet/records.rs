//! Arrow record batches handed in from outside the reader (the Python package's DataFrames,
//! RecordBatches and Tables) -> the rows a file of the same values makes.
//!
//! Columns are found by the schema's names (extra columns are ignored, their order does not
//! matter); each value is written as the text its line would hold and the row is made by
//! [`LineParser::parse_values`], as for a Parquet file (see [`crate::parquet`]): the same ids,
//! dense transforms, limits and bad-row rules as text. The Arrow buffers are read in place.

use arrow_array::{Array, RecordBatch};

use super::decode::{row_text, text_values, TextValues};
use crate::batch::BatchBuilder;
use crate::error::DataError;
use crate::parse::{BadLine, LineParser};
use crate::schema::{ColumnKind, Schema};

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
                    bad(r, &reason, &row_text(&text, &spans, self.parser.separator()));
                    rows.bad.push(r);
                }
            }
        }
        Ok(rows)
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
            ("user", Arc::new(StringArray::from(vec![Some("u1"), None, Some("u3")])) as ArrayRef),
            ("extra", Arc::new(Int64Array::from(vec![7, 8, 9]))),
            ("label", Arc::new(Int64Array::from(vec![1, 0, 1]))),
            ("price", Arc::new(Float64Array::from(vec![Some(2.5), Some(3.0), None]))),
        ]);
        let mut out = parser.builder(4);
        let got = rows.append(&b, &mut out, |_, _, _| panic!("no bad row")).unwrap();
        assert_eq!(got, Rows { good: 3, bad: vec![] });
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
        assert_eq!(got, Rows { good: 1, bad: vec![1] });
        assert_eq!(seen[0].0, 1);
        assert!(matches!(seen[0].1, BadLine::BadLabel { .. }));
        assert_eq!(seen[0].2, "2\t2\tb");
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

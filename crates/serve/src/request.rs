//! Prediction requests: JSON rows with fields by name, or lines in the training layout, turned
//! into the [`Batch`] the trainer would have parsed from the same values.

use serde::Deserialize;
use serde_json::{Map, Value};
use sparta_data::parse::parse_dense;
use sparta_data::{feature_id, missing_id, Batch, BatchBuilder, ColumnKind, LineParser, Schema};

/// `POST /v1/predict` body: exactly one of `rows` and `tsv`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictRequest {
    /// Rows as objects, fields by schema column name (absent or `null` = missing).
    pub rows: Option<Vec<Map<String, Value>>>,
    /// Lines in the training layout (the label column present and ignored).
    pub tsv: Option<Vec<String>>,
}

/// A request that cannot be scored; the text says why (it goes into the 400 answer).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// How each schema column is read from a JSON row.
#[derive(Clone, Debug)]
enum Slot {
    Label,
    Dense(usize),
    Sparse(u8),
    Multi(u8, char),
    Ignore,
}

/// Turns requests into batches for one schema.
#[derive(Clone, Debug)]
pub struct RequestParser {
    schema: Schema,
    columns: hashbrown::HashMap<String, Slot>,
    /// Fields in order, for filling missing values.
    fields: Vec<(String, Slot)>,
    parser: LineParser,
    label_column: usize,
}

impl RequestParser {
    /// A parser for `schema` (validated).
    pub fn new(schema: &Schema) -> RequestParser {
        let mut field = 0u8;
        let mut dense = 0usize;
        let mut columns = hashbrown::HashMap::new();
        let mut fields = Vec::new();
        let mut label_column = 0;
        for (i, c) in schema.columns.iter().enumerate() {
            let slot = match c.kind {
                ColumnKind::Label => {
                    label_column = i;
                    Slot::Label
                }
                ColumnKind::Dense => {
                    dense += 1;
                    Slot::Dense(dense - 1)
                }
                ColumnKind::Sparse => {
                    field += 1;
                    Slot::Sparse(field - 1)
                }
                ColumnKind::MultiSparse { separator } => {
                    field += 1;
                    Slot::Multi(field - 1, separator)
                }
                ColumnKind::Ignore => Slot::Ignore,
            };
            columns.insert(c.name.clone(), slot.clone());
            fields.push((c.name.clone(), slot));
        }
        RequestParser {
            schema: schema.clone(),
            columns,
            fields,
            parser: LineParser::new(schema),
            label_column,
        }
    }

    /// Parses a request body (JSON) into a batch; `max_rows` bounds its rows.
    pub fn parse_body(&self, body: &[u8], max_rows: usize) -> Result<Batch, BadRequest> {
        let req: PredictRequest = serde_json::from_slice(body)
            .map_err(|e| BadRequest(format!("invalid JSON request: {e}")))?;
        let n = match (&req.rows, &req.tsv) {
            (Some(r), None) => r.len(),
            (None, Some(t)) => t.len(),
            _ => {
                return Err(BadRequest(
                    "give exactly one of \"rows\" and \"tsv\"".into(),
                ))
            }
        };
        if n == 0 {
            return Err(BadRequest("no rows to score".into()));
        }
        if n > max_rows {
            return Err(BadRequest(format!(
                "{n} rows in one request, at most {max_rows}"
            )));
        }
        match (req.rows, req.tsv) {
            (Some(rows), _) => self.rows(&rows),
            (_, Some(lines)) => self.lines(&lines),
            _ => unreachable!("checked above"),
        }
    }

    /// Rows given as JSON objects.
    pub fn rows(&self, rows: &[Map<String, Value>]) -> Result<Batch, BadRequest> {
        let mut b = BatchBuilder::new(
            self.schema.num_fields(),
            self.schema.num_dense(),
            rows.len(),
        );
        let mut dense = vec![0f32; self.schema.num_dense()];
        for (r, row) in rows.iter().enumerate() {
            let bad = |m: String| BadRequest(format!("row {r}: {m}"));
            for name in row.keys() {
                if !self.columns.contains_key(name) {
                    return Err(bad(format!("unknown field {name:?}")));
                }
            }
            b.begin_row();
            b.push_label(0.0);
            dense.fill(0.0);
            for (name, slot) in &self.fields {
                let value = row.get(name).filter(|v| !v.is_null());
                match *slot {
                    Slot::Label | Slot::Ignore => {}
                    Slot::Dense(i) => {
                        if let Some(v) = value {
                            dense[i] = dense_value(v).ok_or_else(|| {
                                bad(format!("field {name:?}: expected a finite number, got {v}"))
                            })?;
                        }
                    }
                    Slot::Sparse(f) => {
                        let id = match value {
                            None => missing_id(f),
                            Some(v) => match sparse_text(v) {
                                Some(s) if s.is_empty() => missing_id(f),
                                Some(s) => feature_id(f, s.as_bytes()),
                                None => {
                                    return Err(bad(format!(
                                        "field {name:?}: expected a string or an integer, got {v}"
                                    )))
                                }
                            },
                        };
                        b.push_id(id);
                        b.end_field();
                    }
                    Slot::Multi(f, sep) => {
                        let before = b.num_ids();
                        let mut push = |s: &str| {
                            for part in s.split(sep).filter(|p| !p.is_empty()) {
                                b.push_id(feature_id(f, part.as_bytes()));
                            }
                        };
                        match value {
                            None => {}
                            Some(Value::Array(items)) => {
                                for it in items {
                                    let s = sparse_text(it).ok_or_else(|| {
                                        bad(format!(
                                            "field {name:?}: expected strings or integers, got {it}"
                                        ))
                                    })?;
                                    push(&s);
                                }
                            }
                            Some(v) => {
                                let s = sparse_text(v).ok_or_else(|| {
                                    bad(format!(
                                        "field {name:?}: expected a string, an integer or a list, got {v}"
                                    ))
                                })?;
                                push(&s);
                            }
                        }
                        if b.num_ids() == before {
                            b.push_id(missing_id(f));
                        }
                        b.end_field();
                    }
                }
            }
            for &x in &dense {
                b.push_dense(x);
            }
            b.end_row();
        }
        Ok(b.take())
    }

    /// Lines in the training layout. The label column must be present; its value is ignored.
    pub fn lines<S: AsRef<str>>(&self, lines: &[S]) -> Result<Batch, BadRequest> {
        let mut b = BatchBuilder::new(
            self.schema.num_fields(),
            self.schema.num_dense(),
            lines.len(),
        );
        for (i, line) in lines.iter().enumerate() {
            let line = line.as_ref().trim_end_matches(['\n', '\r']);
            self.parse_line(line.as_bytes(), &mut b)
                .map_err(|e| BadRequest(format!("line {i}: {e}")))?;
        }
        Ok(b.take())
    }

    /// Parses one line (label ignored) and appends it to `b`; on error nothing is appended.
    pub fn parse_line(
        &self,
        line: &[u8],
        b: &mut BatchBuilder,
    ) -> Result<(), sparta_data::BadLine> {
        match self.parser.parse_line(line, b) {
            Err(sparta_data::BadLine::BadLabel { .. }) => {
                // The label is ignored: score the line with a placeholder label.
                let relabeled = self.replace_label(line);
                self.parser.parse_line(&relabeled, b)
            }
            r => r,
        }
    }

    fn replace_label(&self, line: &[u8]) -> Vec<u8> {
        let sep = self.schema.separator as u8;
        let mut out = Vec::with_capacity(line.len() + 1);
        for (i, col) in line.split(|&c| c == sep).enumerate() {
            if i > 0 {
                out.push(sep);
            }
            out.extend_from_slice(if i == self.label_column { b"0" } else { col });
        }
        out
    }
}

fn dense_value(v: &Value) -> Option<f32> {
    match v {
        // Through the text, so a value scores as it does in a TSV line.
        Value::Number(n) => parse_dense(n.to_string().as_bytes()),
        Value::String(s) => parse_dense(s.as_bytes()),
        _ => None,
    }
}

fn sparse_text(v: &Value) -> Option<std::borrow::Cow<'_, str>> {
    match v {
        Value::String(s) => Some(std::borrow::Cow::Borrowed(s)),
        Value::Number(n) if n.is_i64() || n.is_u64() => {
            Some(std::borrow::Cow::Owned(n.to_string()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn criteo_line(label: &str) -> String {
        let mut cols = vec![label.to_string()];
        cols.extend((1..=13).map(|i| if i == 2 { String::new() } else { i.to_string() }));
        cols.extend((1..=26).map(|i| {
            if i == 5 {
                String::new()
            } else {
                format!("{i:08x}")
            }
        }));
        cols.join("\t")
    }

    fn criteo_row() -> Map<String, Value> {
        let mut m = Map::new();
        for i in 1..=13 {
            if i != 2 {
                m.insert(format!("I{i}"), Value::from(i));
            }
        }
        for i in 1..=26 {
            if i != 5 {
                m.insert(format!("C{i}"), Value::from(format!("{i:08x}")));
            }
        }
        m
    }

    #[test]
    fn json_rows_and_lines_give_the_same_batch() {
        let p = RequestParser::new(&Schema::criteo());
        let from_line = p.lines(&[criteo_line("1")]).unwrap();
        let from_row = p.rows(&[criteo_row()]).unwrap();
        assert_eq!(from_row.ids, from_line.ids);
        assert_eq!(from_row.dense, from_line.dense);
        assert_eq!(from_row.offsets, from_line.offsets);
        // The label is ignored, even when it is not a label.
        let unlabeled = p.lines(&[criteo_line("")]).unwrap();
        assert_eq!(unlabeled.ids, from_line.ids);
        // Dense values as strings, sparse values as integers.
        let mut row = criteo_row();
        row.insert("I3".into(), Value::from("3"));
        row.insert("C1".into(), Value::from(7));
        let b = p.rows(&[row]).unwrap();
        assert_eq!(b.dense, from_line.dense);
        assert_eq!(b.ids[0], feature_id(0, b"7"));
    }

    #[test]
    fn bad_requests_name_the_reason() {
        let p = RequestParser::new(&Schema::criteo());
        let cases: [(&str, &str); 8] = [
            (r#"{"rows": [{"X9": 1}]}"#, "unknown field \"X9\""),
            (r#"{"rows": [{"I1": "abc"}]}"#, "expected a finite number"),
            (
                r#"{"rows": [{"C1": 1.5}]}"#,
                "expected a string or an integer",
            ),
            (
                r#"{"rows": [{"C1": true}]}"#,
                "expected a string or an integer",
            ),
            (r#"{"tsv": ["1\t2\t3"]}"#, "too few columns"),
            (r#"{"rows": [], "tsv": []}"#, "exactly one"),
            (r#"{"rows": []}"#, "no rows"),
            (r#"{"rows": [{}, {}, {}]}"#, "at most 2"),
        ];
        for (body, want) in cases {
            let e = p.parse_body(body.as_bytes(), 2).unwrap_err().0;
            assert!(e.contains(want), "{body}: {e:?} lacks {want:?}");
        }
        assert!(p
            .parse_body(b"{not json", 2)
            .unwrap_err()
            .0
            .contains("invalid JSON"));
        assert!(p.parse_body(br#"{"rowz": []}"#, 2).is_err());
        // Absent fields read as missing values.
        let b = p.parse_body(br#"{"rows": [{}]}"#, 2).unwrap();
        assert_eq!(b.ids[3], missing_id(3));
        assert!(b.dense.iter().all(|&x| x == 0.0));
    }
}

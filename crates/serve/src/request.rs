//! Prediction requests: JSON rows with fields by name, or lines in the training layout, turned
//! into the [`Batch`] the trainer would have parsed from the same values.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use sparta_data::features::{InputPlan, SlotKind};
use sparta_data::parse::{parse_number, MAX_ABS_DENSE};
use sparta_data::{BadLine, Batch, BatchBuilder, ColumnKind, LineParser, Schema};

/// `POST /v1/predict` body: exactly one of `rows` and `tsv`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictRequest {
    /// Rows as objects, fields by schema column name (absent or `null` = missing). A field
    /// given twice in one row is refused (JSON would otherwise keep the last silently).
    #[serde(default, deserialize_with = "rows_without_duplicate_fields")]
    pub rows: Option<Vec<Map<String, Value>>>,
    /// Lines in the training layout (the label column present and ignored).
    pub tsv: Option<Vec<String>>,
}

/// Whether a `POST /v1/predict` may be read as JSON given its `Content-Type` header value:
/// `application/json`, any case, with or without parameters (`; charset=utf-8`). No header
/// at all is read as JSON too (many clients send none); any other type is refused (415).
pub fn is_json_content_type(value: Option<&[u8]>) -> bool {
    let Some(v) = value else { return true };
    std::str::from_utf8(v).is_ok_and(|v| {
        let essence = v.split(';').next().unwrap_or_default().trim();
        essence.eq_ignore_ascii_case("application/json")
    })
}

/// A request that cannot be scored; the text says why (it goes into the 400 answer).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Why a JSON value cannot be a column's value (the text goes into the 400 answer, after the
/// row and field).
#[derive(Debug, thiserror::Error)]
enum BadValue {
    /// A dense value that is not a finite number.
    #[error("expected a finite number, got {0}")]
    Dense(Value),
    /// A dense value beyond the magnitude training accepts.
    #[error("{0} is out of range: {range}", range = DENSE_RANGE)]
    DenseRange(Value),
    /// A sparse value that is neither a string nor an integer.
    #[error("expected a string or an integer, got {0}")]
    Id(Value),
    /// A weighted bag's list item that is not a `[value, weight]` pair.
    #[error("expected [value, weight] items, got {0}")]
    Pair(Value),
    /// The value of a `[value, weight]` pair that is neither a string nor an integer.
    #[error("expected a string or an integer value, got {0}")]
    PairValue(Value),
    /// A weighted bag's list item that is neither an id nor a pair.
    #[error("expected strings, integers or [value, weight] pairs, got {0}")]
    WeightedItem(Value),
    /// A bag's list item that is not an id.
    #[error("expected strings or integers, got {0}")]
    Item(Value),
    /// A bag value that is neither an id nor a list.
    #[error("expected a string, an integer or a list, got {0}")]
    Bag(Value),
}

/// Why a finite dense value is refused: the reader's bound ([`MAX_ABS_DENSE`]).
const DENSE_RANGE: &str = "dense values are at most 2^50 = 1125899906842624 in magnitude \
     (as in training, where a line holding a larger one is malformed)";

/// What is wrong with a dense value's text, as the line parser judges it: `None` for a number
/// it accepts (its transform may still overflow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DenseFault {
    /// Not a finite number.
    NotANumber,
    /// Beyond [`MAX_ABS_DENSE`].
    OutOfRange,
}

fn dense_fault(text: &str) -> Option<DenseFault> {
    match parse_number(text.as_bytes()) {
        None => Some(DenseFault::NotANumber),
        Some(x) if x.abs() > MAX_ABS_DENSE => Some(DenseFault::OutOfRange),
        Some(_) => None,
    }
}

/// Why the line parser refused a dense value `text` it was given: not a number, beyond the
/// range, or a number whose transform is not a finite f32.
fn dense_reason(text: &str) -> String {
    match dense_fault(text) {
        Some(DenseFault::NotANumber) => format!("expected a finite number, got {text:?}"),
        Some(DenseFault::OutOfRange) => format!("{text} is out of range: {DENSE_RANGE}"),
        None => format!("the column's transform of {text} is not a finite number"),
    }
}

/// `rows`: a list of objects, each refused (naming the row and the field) when it holds a
/// field twice.
fn rows_without_duplicate_fields<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<Map<String, Value>>>, D::Error> {
    struct Rows;
    impl<'de> Visitor<'de> for Rows {
        type Value = Option<Vec<Map<String, Value>>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of row objects")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut rows = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(row) = seq.next_element_seed(Row(rows.len()))? {
                rows.push(row);
            }
            Ok(Some(rows))
        }
    }
    /// Row number `.0`.
    struct Row(usize);
    impl<'de> DeserializeSeed<'de> for Row {
        type Value = Map<String, Value>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Row {
        type Value = Map<String, Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "row {}: an object of fields", self.0)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut row = Map::new();
            while let Some(name) = map.next_key::<String>()? {
                if row.contains_key(&name) {
                    return Err(serde::de::Error::custom(format!(
                        "row {}: duplicate field {name:?}",
                        self.0
                    )));
                }
                let v: Value = map.next_value()?;
                row.insert(name, v);
            }
            Ok(row)
        }
    }
    d.deserialize_option(Rows)
}

/// Turns requests into batches for one schema and input plan.
#[derive(Clone, Debug)]
pub struct RequestParser {
    schema: Schema,
    /// Column index by name.
    columns: hashbrown::HashMap<String, usize>,
    /// Per column: the weight separator when a weighted bag reads it (JSON `[value, weight]`
    /// items become `value<sep>weight`).
    weight_separator: Vec<Option<u8>>,
    parser: LineParser,
    /// Per column: the placeholder a request's row gets there, for the label columns (`0`) and
    /// the sample weight (empty: 1), which requests do not give.
    placeholder: Vec<Option<&'static [u8]>>,
}

impl RequestParser {
    /// A parser for `schema` (validated) making the rows of `plan` (validated against it;
    /// [`InputPlan::legacy`] for a job without feature columns).
    pub fn new(schema: &Schema, plan: &InputPlan) -> RequestParser {
        let mut weight_separator = vec![None; schema.columns.len()];
        for s in &plan.slots {
            if let SlotKind::Bag {
                weighted: true,
                weight_separator: sep,
                ..
            } = s.kind
            {
                weight_separator[s.column] = Some(sep);
            }
        }
        RequestParser {
            schema: schema.clone(),
            columns: schema
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| (c.name.clone(), i))
                .collect(),
            weight_separator,
            parser: LineParser::with_plan(schema, plan),
            placeholder: schema
                .columns
                .iter()
                .map(|c| match c.kind {
                    ColumnKind::Label => Some(&b"0"[..]),
                    ColumnKind::Weight => Some(&b""[..]),
                    _ => None,
                })
                .collect(),
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

    /// Rows given as JSON objects: every column's value becomes the bytes a line would hold,
    /// then the row is made by the line parser's own per-column code.
    pub fn rows(&self, rows: &[Map<String, Value>]) -> Result<Batch, BadRequest> {
        let mut b = self.parser.builder(rows.len());
        let mut values: Vec<Option<Vec<u8>>> = vec![None; self.schema.columns.len()];
        for (r, row) in rows.iter().enumerate() {
            let bad = |m: String| BadRequest(format!("row {r}: {m}"));
            values.iter_mut().for_each(|v| *v = None);
            for (name, v) in row {
                let Some(&c) = self.columns.get(name) else {
                    return Err(bad(format!("unknown field {name:?}")));
                };
                if v.is_null() {
                    continue;
                }
                values[c] = self
                    .column_bytes(c, v)
                    .map_err(|m| bad(format!("field {name:?}: {m}")))?;
            }
            self.parser
                .parse_values(|c| self.placeholder[c].or(values[c].as_deref()), &mut b)
                .map_err(|e| match e {
                    // `column_bytes` checked the number and its range: its transform overflows.
                    BadLine::BadDense { column } => bad(format!(
                        "field {column:?}: the column's transform of the value is not a finite number"
                    )),
                    BadLine::BadWeight { column } => bad(format!(
                        "field {column:?}: an item weight is not a finite number"
                    )),
                    e => bad(e.to_string()),
                })?;
        }
        Ok(b.take())
    }

    /// The bytes a line would hold in column `c` for the JSON value `v` (not null); `None`
    /// for the label and ignored columns (not read from requests).
    fn column_bytes(&self, c: usize, v: &Value) -> Result<Option<Vec<u8>>, BadValue> {
        let bytes = match self.schema.columns[c].kind {
            ColumnKind::Label | ColumnKind::Weight | ColumnKind::Ignore => return Ok(None),
            ColumnKind::Dense => {
                let text = match v {
                    // Through the text, so a value scores as it does in a TSV line.
                    Value::Number(n) => n.to_string(),
                    Value::String(s) => s.clone(),
                    _ => String::new(),
                };
                match dense_fault(&text) {
                    Some(DenseFault::NotANumber) => return Err(BadValue::Dense(v.clone())),
                    Some(DenseFault::OutOfRange) => return Err(BadValue::DenseRange(v.clone())),
                    None => {}
                }
                text.into_bytes()
            }
            ColumnKind::Sparse => sparse_text(v)
                .ok_or_else(|| BadValue::Id(v.clone()))?
                .into_owned()
                .into_bytes(),
            ColumnKind::MultiSparse { separator } => {
                let weight_sep = self.weight_separator[c];
                match v {
                    Value::Array(items) => {
                        let mut out = String::new();
                        for (k, it) in items.iter().enumerate() {
                            if k > 0 {
                                out.push(separator);
                            }
                            match (it, weight_sep) {
                                (Value::Array(pair), Some(ws)) => {
                                    let (value, weight) = match pair.as_slice() {
                                        [value, Value::Number(w)] => (value, w),
                                        _ => return Err(BadValue::Pair(it.clone())),
                                    };
                                    let value = sparse_text(value)
                                        .ok_or_else(|| BadValue::PairValue(value.clone()))?;
                                    out.push_str(&value);
                                    out.push(ws as char);
                                    out.push_str(&weight.to_string());
                                }
                                _ => out.push_str(&sparse_text(it).ok_or_else(|| {
                                    if weight_sep.is_some() {
                                        BadValue::WeightedItem(it.clone())
                                    } else {
                                        BadValue::Item(it.clone())
                                    }
                                })?),
                            }
                        }
                        out.into_bytes()
                    }
                    v => sparse_text(v)
                        .ok_or_else(|| BadValue::Bag(v.clone()))?
                        .into_owned()
                        .into_bytes(),
                }
            }
        };
        Ok(Some(bytes))
    }

    /// Lines in the training layout. The label (and sample-weight) columns must be present;
    /// their values are ignored.
    pub fn lines<S: AsRef<str>>(&self, lines: &[S]) -> Result<Batch, BadRequest> {
        let mut b = self.parser.builder(lines.len());
        for (i, line) in lines.iter().enumerate() {
            let line = line.as_ref().trim_end_matches(['\n', '\r']);
            self.parse_line(line.as_bytes(), &mut b).map_err(|e| {
                let why = match &e {
                    BadLine::BadDense { column } => match self.raw_value(line, column) {
                        Some(text) => format!("dense value {column:?}: {}", dense_reason(text)),
                        None => e.to_string(),
                    },
                    _ => e.to_string(),
                };
                BadRequest(format!("line {i}: {why}"))
            })?;
        }
        Ok(b.take())
    }

    /// The text of column `name` in `line` (as the line parser splits it).
    fn raw_value<'a>(&self, line: &'a str, name: &str) -> Option<&'a str> {
        let &c = self.columns.get(name)?;
        line.split(self.schema.separator).nth(c)
    }

    /// A builder of batches of this parser's shape (weighted when the plan is).
    pub fn builder(&self, capacity: usize) -> BatchBuilder {
        self.parser.builder(capacity)
    }

    /// Parses one line (labels and sample weight ignored) and appends it to `b`; on error
    /// nothing is appended.
    pub fn parse_line(&self, line: &[u8], b: &mut BatchBuilder) -> Result<(), BadLine> {
        match self.parser.parse_line(line, b) {
            Err(BadLine::BadLabel { .. } | BadLine::BadSampleWeight { .. }) => {
                // Labels and weight are ignored: score the line with placeholders.
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
            out.extend_from_slice(self.placeholder.get(i).copied().flatten().unwrap_or(col));
        }
        out
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

    #[test]
    fn json_content_types_are_read_others_refused() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=UTF-8",
            " application/json ",
        ] {
            assert!(is_json_content_type(Some(ok.as_bytes())), "{ok}");
        }
        assert!(is_json_content_type(None), "no header: read as JSON");
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/jsonx",
            "application/json-seq",
            "multipart/form-data; boundary=x",
            "",
        ] {
            assert!(!is_json_content_type(Some(bad.as_bytes())), "{bad}");
        }
        assert!(!is_json_content_type(Some(b"application/json\xff")));
    }
    use sparta_data::{feature_id, missing_id};

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
        let p = RequestParser::new(&Schema::criteo(), &InputPlan::legacy(&Schema::criteo()));
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
        let p = RequestParser::new(&Schema::criteo(), &InputPlan::legacy(&Schema::criteo()));
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

    #[test]
    fn a_dense_value_beyond_the_training_range_is_named_out_of_range_not_infinite() {
        let p = RequestParser::new(&Schema::criteo(), &InputPlan::legacy(&Schema::criteo()));
        // 2^50 is the largest accepted; one more is refused, as a training line would be.
        assert!(p
            .parse_body(br#"{"rows": [{"I1": 1125899906842624}]}"#, 2)
            .is_ok());
        for body in [
            r#"{"rows": [{"I1": 1125899906842625}]}"#,
            r#"{"rows": [{"I1": -1e300}]}"#,
            r#"{"rows": [{"I1": "1e20"}]}"#,
        ] {
            let e = p.parse_body(body.as_bytes(), 2).unwrap_err().0;
            assert!(
                e.contains("field \"I1\"") && e.contains("out of range") && e.contains("2^50"),
                "{body}: {e}"
            );
            assert!(!e.contains("finite"), "{body}: {e}");
        }
        let mut line: Vec<String> = criteo_line("1").split('\t').map(String::from).collect();
        line[1] = "1125899906842625".into();
        let e = p.lines(&[line.join("\t")]).unwrap_err().0;
        assert!(
            e.contains("\"I1\"") && e.contains("out of range") && !e.contains("not a number"),
            "{e}"
        );
        line[1] = "x".into();
        let e = p.lines(&[line.join("\t")]).unwrap_err().0;
        assert!(e.contains("expected a finite number, got \"x\""), "{e}");
    }

    #[test]
    fn a_field_given_twice_in_a_row_is_refused_by_name() {
        let p = RequestParser::new(&Schema::criteo(), &InputPlan::legacy(&Schema::criteo()));
        let e = p
            .parse_body(
                br#"{"rows": [{"I1": 1}, {"C1": "a", "I2": 2, "C1": "b"}]}"#,
                2,
            )
            .unwrap_err()
            .0;
        assert!(e.contains("row 1: duplicate field \"C1\""), "{e}");
        let e = p
            .parse_body(br#"{"rows": [{"I1": 1}], "rows": [{"I1": 2}]}"#, 2)
            .unwrap_err()
            .0;
        assert!(e.contains("duplicate field `rows`"), "{e}");
        // The same name in two rows is fine; `"rows": null` is no rows given.
        assert!(p
            .parse_body(br#"{"rows": [{"I1": 1}, {"I1": 2}]}"#, 2)
            .is_ok());
        let e = p.parse_body(br#"{"rows": null}"#, 2).unwrap_err().0;
        assert!(e.contains("exactly one"), "{e}");
    }

    fn rich() -> (Schema, InputPlan) {
        use sparta_data::features::{DenseInput, DenseTransform, Pooling, Slot};
        use sparta_data::Column;
        let schema = Schema {
            columns: vec![
                Column::new("label", ColumnKind::Label),
                Column::new("user_id", ColumnKind::Sparse),
                Column::new("tags", ColumnKind::MultiSparse { separator: '|' }),
                Column::new("hist", ColumnKind::MultiSparse { separator: '|' }),
                Column::new("price", ColumnKind::Dense),
            ],
            separator: '\t',
            header: false,
        };
        let slot = |name: &str, column, tag, kind| Slot {
            name: name.into(),
            column,
            tag,
            kind,
        };
        let plan = InputPlan {
            slots: vec![
                slot(
                    "tags",
                    2,
                    2,
                    SlotKind::Bag {
                        pooling: Pooling::Mean,
                        weighted: true,
                        weight_separator: b':',
                    },
                ),
                slot("user_id", 1, 0, SlotKind::Id),
                slot("hist", 3, 1, SlotKind::Sequence { max_len: 2 }),
                slot(
                    "price_b",
                    4,
                    3,
                    SlotKind::Buckets {
                        boundaries: vec![5.0, 20.0],
                    },
                ),
            ],
            dense: vec![DenseInput {
                name: "price".into(),
                column: 4,
                transform: DenseTransform::Log1p,
            }],
        };
        plan.validate(&schema).unwrap();
        (schema, plan)
    }

    fn row(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn rich_json_rows_equal_lines() {
        let (schema, plan) = rich();
        let p = RequestParser::new(&schema, &plan);
        let line = p.lines(&["1\tu1\ta:0.5|b\th1|h2|h3\t12.5"]).unwrap();
        line.check_tags(&[2, 0, 1, 3]).unwrap();
        assert_eq!(line.weights, vec![0.5, 1.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(
            line.ids_of(0, 2),
            &[feature_id(1, b"h2"), feature_id(1, b"h3")]
        );
        assert_eq!(line.ids_of(0, 3), &[missing_id(3) | 2]);
        for json in [
            r#"{"user_id": "u1", "tags": [["a", 0.5], "b"], "hist": ["h1", "h2", "h3"], "price": 12.5}"#,
            r#"{"user_id": "u1", "tags": "a:0.5|b", "hist": "h1|h2|h3", "price": "12.5"}"#,
            r#"{"user_id": "u1", "tags": ["a:0.5", "b"], "hist": ["h1", "h2|h3"], "price": 12.5, "label": 1}"#,
        ] {
            let b = p.rows(&[row(json)]).unwrap();
            assert_eq!(
                (&b.ids, &b.offsets, &b.weights, &b.dense),
                (&line.ids, &line.offsets, &line.weights, &line.dense),
                "{json}"
            );
        }
        // integers as values; absent and null are missing (weight 1)
        let b = p
            .rows(&[row(r#"{"user_id": 7, "tags": [[3, 2]], "hist": null}"#)])
            .unwrap();
        assert_eq!(b.ids[0], feature_id(2, b"3"));
        assert_eq!(b.weights, vec![2.0, 1.0, 1.0, 1.0]);
        assert_eq!(
            &b.ids[1..],
            &[feature_id(0, b"7"), missing_id(1), missing_id(3)]
        );
        assert_eq!(b.dense, vec![0.0]);
    }

    /// Several labels and a sample weight: requests give none of them (JSON rows) or any
    /// values there (lines); rows score the same either way.
    #[test]
    fn labels_and_the_sample_weight_are_not_read_from_requests() {
        use sparta_data::Column;
        let schema = Schema {
            columns: vec![
                Column::new("click", ColumnKind::Label),
                Column::new("user_id", ColumnKind::Sparse),
                Column::new("w", ColumnKind::Weight),
                Column::new("conversion", ColumnKind::Label),
            ],
            separator: '\t',
            header: false,
        };
        schema.validate().unwrap();
        let p = RequestParser::new(&schema, &InputPlan::legacy(&schema));
        let want = p.lines(&["1\tu1\t0.5\t1"]).unwrap();
        for line in ["x\tu1\t-3\t7", "0\tu1\t\t", "1\tu1\tnan\t1"] {
            let b = p.lines(&[line]).unwrap();
            assert_eq!(b.ids, want.ids, "{line}");
        }
        for json in [
            r#"{"user_id": "u1"}"#,
            r#"{"user_id": "u1", "click": 1, "conversion": 5, "w": -1}"#,
        ] {
            let b = p.rows(&[row(json)]).unwrap();
            assert_eq!((&b.ids, b.num_labels), (&want.ids, 2), "{json}");
        }
    }

    #[test]
    fn rich_bad_rows_name_the_field() {
        let (schema, plan) = rich();
        let p = RequestParser::new(&schema, &plan);
        for (json, want) in [
            (r#"{"tags": "a:x"}"#, "field \"tags\": an item weight"),
            (r#"{"tags": [["a", "x"]]}"#, "[value, weight]"),
            (r#"{"tags": [["a", 1, 2]]}"#, "[value, weight]"),
            (r#"{"hist": [["a", 1]]}"#, "expected strings or integers"),
            (
                r#"{"price": "cheap"}"#,
                "field \"price\": expected a finite number",
            ),
            (r#"{"price": true}"#, "expected a finite number"),
        ] {
            let e = p.rows(&[row(json)]).unwrap_err().0;
            assert!(e.contains(want), "{json}: {e:?} lacks {want:?}");
        }
        let e = p.lines(&["0\tu\ta:zz\t\t1"]).unwrap_err().0;
        assert!(e.contains("\"tags\"") && e.contains("weight"), "{e}");
    }
}

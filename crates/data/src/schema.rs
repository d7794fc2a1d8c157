//! Column layout of a click log: which columns are labels (one per task) and the sample
//! weight, which are dense (numeric) features and which are sparse (categorical) fields.

use serde::{Deserialize, Serialize};

use crate::error::DataError;

/// Most sparse fields a schema may have (the field index lives in the top 8 bits of an id).
pub const MAX_FIELDS: usize = 255;

/// What a column holds.
///
/// Serialized tagged by `kind`, e.g. `kind = "multi_sparse", separator = "|"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ColumnKind {
    /// A label: `0`/`1` (also `0.0`/`1.0`). A schema has one or more (one per task, e.g. a
    /// click and a conversion); the first is the one single-task jobs train on.
    Label,
    /// The sample weight of the row (at most one per schema): a finite number `>= 0`; empty
    /// is 1.
    Weight,
    /// A numeric feature; missing is 0, values go through [`crate::log_transform`].
    Dense,
    /// A categorical field with one value per row (empty is the missing id).
    Sparse,
    /// A categorical field with several values per row split by `separator`.
    MultiSparse {
        /// Separator between the values inside the column.
        separator: char,
    },
    /// A column that is read past and dropped.
    Ignore,
}

/// One column of a schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawColumn", into = "RawColumn")]
pub struct Column {
    /// Column (and feature) name.
    pub name: String,
    /// What the column holds.
    pub kind: ColumnKind,
}

/// Flat serde form of [`Column`]: `{ name = "C1", kind = "sparse" }`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    name: String,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    separator: Option<char>,
}

/// Why a [`RawColumn`] is not a [`Column`].
#[derive(Debug, thiserror::Error)]
enum BadColumn {
    /// A `separator` on a kind other than `multi_sparse`.
    #[error("column {0:?}: `separator` is only allowed for kind \"multi_sparse\"")]
    SeparatorNotAllowed(String),
    /// A `multi_sparse` column without a `separator`.
    #[error("column {0:?}: kind \"multi_sparse\" needs a `separator`")]
    NoSeparator(String),
    /// An unknown `kind`.
    #[error(
        "column {name:?}: unknown kind {kind:?} (expected label, weight, dense, sparse, multi_sparse or ignore)"
    )]
    UnknownKind {
        /// The column.
        name: String,
        /// The kind given.
        kind: String,
    },
}

impl TryFrom<RawColumn> for Column {
    type Error = BadColumn;

    fn try_from(raw: RawColumn) -> Result<Self, BadColumn> {
        let plain = |kind: ColumnKind| match raw.separator {
            Some(_) => Err(BadColumn::SeparatorNotAllowed(raw.name.clone())),
            None => Ok(kind),
        };
        let kind = match raw.kind.as_str() {
            "label" => plain(ColumnKind::Label)?,
            "weight" => plain(ColumnKind::Weight)?,
            "dense" => plain(ColumnKind::Dense)?,
            "sparse" => plain(ColumnKind::Sparse)?,
            "ignore" => plain(ColumnKind::Ignore)?,
            "multi_sparse" => ColumnKind::MultiSparse {
                separator: raw
                    .separator
                    .ok_or_else(|| BadColumn::NoSeparator(raw.name.clone()))?,
            },
            other => {
                return Err(BadColumn::UnknownKind {
                    name: raw.name.clone(),
                    kind: other.to_string(),
                })
            }
        };
        Ok(Column {
            name: raw.name,
            kind,
        })
    }
}

impl From<Column> for RawColumn {
    fn from(c: Column) -> Self {
        let (kind, separator) = match c.kind {
            ColumnKind::Label => ("label", None),
            ColumnKind::Weight => ("weight", None),
            ColumnKind::Dense => ("dense", None),
            ColumnKind::Sparse => ("sparse", None),
            ColumnKind::MultiSparse { separator } => ("multi_sparse", Some(separator)),
            ColumnKind::Ignore => ("ignore", None),
        };
        RawColumn {
            name: c.name,
            kind: kind.to_string(),
            separator,
        }
    }
}

impl Column {
    /// A column with the given name and kind.
    pub fn new(name: impl Into<String>, kind: ColumnKind) -> Self {
        Column {
            name: name.into(),
            kind,
        }
    }

    /// True for sparse and multi-sparse columns (the ones that become id fields).
    pub fn is_field(&self) -> bool {
        matches!(
            self.kind,
            ColumnKind::Sparse | ColumnKind::MultiSparse { .. }
        )
    }
}

fn default_separator() -> char {
    '\t'
}

/// The layout of every line of a data set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schema {
    /// Columns in file order.
    pub columns: Vec<Column>,
    /// Column separator (ASCII), default tab.
    #[serde(default = "default_separator")]
    pub separator: char,
    /// Skip the first line of each file.
    #[serde(default)]
    pub header: bool,
}

impl Schema {
    /// The Criteo (Kaggle / Terabyte) layout: label, `I1..I13` dense, `C1..C26` sparse, tab separated, no header.
    pub fn criteo() -> Schema {
        let mut columns = vec![Column::new("label", ColumnKind::Label)];
        columns.extend((1..=13).map(|i| Column::new(format!("I{i}"), ColumnKind::Dense)));
        columns.extend((1..=26).map(|i| Column::new(format!("C{i}"), ColumnKind::Sparse)));
        Schema {
            columns,
            separator: '\t',
            header: false,
        }
    }

    /// The Avazu layout: `id` ignored, `click` label, `hour` and all other columns sparse,
    /// comma separated, with a header line.
    pub fn avazu() -> Schema {
        const SPARSE: [&str; 22] = [
            "hour",
            "C1",
            "banner_pos",
            "site_id",
            "site_domain",
            "site_category",
            "app_id",
            "app_domain",
            "app_category",
            "device_id",
            "device_ip",
            "device_model",
            "device_type",
            "device_conn_type",
            "C14",
            "C15",
            "C16",
            "C17",
            "C18",
            "C19",
            "C20",
            "C21",
        ];
        let mut columns = vec![
            Column::new("id", ColumnKind::Ignore),
            Column::new("click", ColumnKind::Label),
        ];
        columns.extend(SPARSE.iter().map(|n| Column::new(*n, ColumnKind::Sparse)));
        Schema {
            columns,
            separator: ',',
            header: true,
        }
    }

    /// Checks the schema: at least one label, at most one weight column, at least one and
    /// at most [`MAX_FIELDS`] sparse fields, unique non-empty names, ASCII separators that
    /// differ from each other and from line ends.
    pub fn validate(&self) -> Result<(), DataError> {
        let err = |m: String| Err(DataError::Schema(m));
        if self.num_labels() == 0 {
            return err("expected at least one column of kind \"label\", found none".into());
        }
        let weights: Vec<&str> = self
            .columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Weight)
            .map(|c| c.name.as_str())
            .collect();
        if weights.len() > 1 {
            return err(format!(
                "expected at most one column of kind \"weight\", found {} ({})",
                weights.len(),
                weights.join(", ")
            ));
        }
        let fields = self.num_fields();
        if fields == 0 {
            return err("expected at least one sparse or multi_sparse column".into());
        }
        if fields > MAX_FIELDS {
            return err(format!(
                "{fields} sparse fields, at most {MAX_FIELDS} are supported"
            ));
        }
        let mut names = std::collections::HashSet::new();
        for c in &self.columns {
            if c.name.is_empty() {
                return err("empty column name".into());
            }
            if !names.insert(c.name.as_str()) {
                return err(format!("duplicate column name {:?}", c.name));
            }
        }
        check_separator(self.separator, "column separator")?;
        for c in &self.columns {
            if let ColumnKind::MultiSparse { separator } = c.kind {
                check_separator(separator, &format!("separator of column {:?}", c.name))?;
                if separator == self.separator {
                    return err(format!(
                        "separator of column {:?} equals the column separator {:?}",
                        c.name, self.separator
                    ));
                }
            }
        }
        Ok(())
    }

    /// Index of the first label column (0 when a schema that failed validation has none).
    pub fn label_index(&self) -> usize {
        self.columns
            .iter()
            .position(|c| c.kind == ColumnKind::Label)
            .unwrap_or(0)
    }

    /// Number of label columns (a batch's `num_labels`).
    pub fn num_labels(&self) -> usize {
        self.columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Label)
            .count()
    }

    /// Names of the label columns in column order (index = label index `k` in a batch's
    /// strided `labels`).
    pub fn label_names(&self) -> Vec<String> {
        self.columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Label)
            .map(|c| c.name.clone())
            .collect()
    }

    /// Index of the sample-weight column, if the schema has one.
    pub fn weight_index(&self) -> Option<usize> {
        self.columns
            .iter()
            .position(|c| c.kind == ColumnKind::Weight)
    }

    /// Number of dense columns.
    pub fn num_dense(&self) -> usize {
        self.columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Dense)
            .count()
    }

    /// Number of sparse + multi-sparse fields.
    pub fn num_fields(&self) -> usize {
        self.columns.iter().filter(|c| c.is_field()).count()
    }

    /// Names of the sparse fields in column order (index = field number in ids).
    pub fn field_names(&self) -> Vec<String> {
        self.columns
            .iter()
            .filter(|c| c.is_field())
            .map(|c| c.name.clone())
            .collect()
    }

    /// Names of the dense columns in column order.
    pub fn dense_names(&self) -> Vec<String> {
        self.columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Dense)
            .map(|c| c.name.clone())
            .collect()
    }
}

fn check_separator(c: char, what: &str) -> Result<(), DataError> {
    if !c.is_ascii() || c == '\n' || c == '\r' {
        return Err(DataError::Schema(format!(
            "{what} {c:?} must be a single ASCII character other than a line end"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_layouts() {
        let c = Schema::criteo();
        c.validate().unwrap();
        assert_eq!(c.columns.len(), 40);
        assert_eq!(c.num_dense(), 13);
        assert_eq!(c.num_fields(), 26);
        assert_eq!(c.field_names()[0], "C1");
        assert_eq!(c.dense_names()[12], "I13");
        let a = Schema::avazu();
        a.validate().unwrap();
        assert_eq!(a.columns.len(), 24);
        assert_eq!(a.num_fields(), 22);
        assert_eq!(a.num_dense(), 0);
        assert!(a.header);
    }

    #[test]
    fn toml_round_trip() {
        let mut s = Schema::criteo();
        s.columns.push(Column::new(
            "tags",
            ColumnKind::MultiSparse { separator: '|' },
        ));
        s.columns.push(Column::new("note", ColumnKind::Ignore));
        let text = toml::to_string(&s).unwrap();
        assert!(text.contains("kind = \"multi_sparse\""), "{text}");
        let back: Schema = toml::from_str(&text).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn toml_hand_written() {
        let text = r#"
            separator = ","
            header = true
            columns = [
                { name = "y", kind = "label" },
                { name = "age", kind = "dense" },
                { name = "city", kind = "sparse" },
                { name = "tags", kind = "multi_sparse", separator = "|" },
            ]
        "#;
        let s: Schema = toml::from_str(text).unwrap();
        s.validate().unwrap();
        assert_eq!(s.separator, ',');
        assert_eq!(
            s.columns[3].kind,
            ColumnKind::MultiSparse { separator: '|' }
        );
        // defaults
        let s: Schema = toml::from_str("columns = [{ name = \"y\", kind = \"label\" }]").unwrap();
        assert_eq!(s.separator, '\t');
        assert!(!s.header);
    }

    #[test]
    fn several_labels_and_a_weight() {
        let text = r#"
            columns = [
                { name = "click", kind = "label" },
                { name = "w", kind = "weight" },
                { name = "user", kind = "sparse" },
                { name = "conversion", kind = "label" },
            ]
        "#;
        let s: Schema = toml::from_str(text).unwrap();
        s.validate().unwrap();
        assert_eq!(s.columns[1].kind, ColumnKind::Weight);
        assert_eq!(s.num_labels(), 2);
        assert_eq!(s.label_names(), ["click", "conversion"]);
        assert_eq!(s.label_index(), 0);
        assert_eq!(s.weight_index(), Some(1));
        assert_eq!(s.num_fields(), 1);
        assert_eq!(s.num_dense(), 0);
        let back: Schema = toml::from_str(&toml::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let c = Schema::criteo();
        assert_eq!(
            (c.num_labels(), c.label_names(), c.weight_index()),
            (1, vec!["label".to_string()], None)
        );
        // a weight takes no separator
        let bad = "columns = [{ name = \"w\", kind = \"weight\", separator = \"|\" }]";
        assert!(toml::from_str::<Schema>(bad).is_err());
    }

    #[test]
    fn toml_rejects_unknown() {
        let bad = [
            "columns = []\nfoo = 1",
            "columns = [{ name = \"y\", kind = \"lable\" }]",
            "columns = [{ name = \"y\", kind = \"label\", extra = 1 }]",
            "columns = [{ name = \"y\", kind = \"sparse\", separator = \"|\" }]",
            "columns = [{ name = \"y\", kind = \"multi_sparse\" }]",
        ];
        for b in bad {
            assert!(toml::from_str::<Schema>(b).is_err(), "accepted: {b}");
        }
    }

    fn expect_invalid(s: &Schema, needle: &str) {
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains(needle), "{e:?} lacks {needle:?}");
    }

    #[test]
    fn validation_errors() {
        let mut s = Schema::criteo();
        s.columns[0].kind = ColumnKind::Dense;
        expect_invalid(&s, "at least one column of kind \"label\"");

        let mut s = Schema::criteo();
        s.columns.push(Column::new("w1", ColumnKind::Weight));
        s.columns.push(Column::new("w2", ColumnKind::Weight));
        expect_invalid(
            &s,
            "at most one column of kind \"weight\", found 2 (w1, w2)",
        );

        let mut s = Schema::criteo();
        s.columns.retain(|c| !c.is_field());
        expect_invalid(&s, "at least one sparse");

        let mut s = Schema::criteo();
        s.columns[5].name = "C3".into();
        expect_invalid(&s, "duplicate column name \"C3\"");

        let mut s = Schema::criteo();
        s.columns
            .extend((0..300).map(|i| Column::new(format!("X{i}"), ColumnKind::Sparse)));
        expect_invalid(&s, "at most 255");

        let mut s = Schema::criteo();
        s.separator = '\n';
        expect_invalid(&s, "line end");

        let mut s = Schema::criteo();
        s.columns.push(Column::new(
            "tags",
            ColumnKind::MultiSparse { separator: '\t' },
        ));
        expect_invalid(&s, "equals the column separator");

        let mut s = Schema::criteo();
        s.columns.push(Column::new(
            "tags",
            ColumnKind::MultiSparse { separator: 'é' },
        ));
        expect_invalid(&s, "ASCII");

        // exactly 255 fields is fine
        let mut s = Schema::criteo();
        s.columns
            .extend((0..229).map(|i| Column::new(format!("X{i}"), ColumnKind::Sparse)));
        assert_eq!(s.num_fields(), 255);
        s.validate().unwrap();
    }
}

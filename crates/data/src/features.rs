//! The input plan: which columns become which model inputs (feature columns).
//!
//! A [`Schema`] says what each column of a line holds; an [`InputPlan`] says what the job makes
//! of them: sparse *slots* (an `id`, a multi-hot `bag`, an ordered `sequence`, or a numeric column
//! cut into `buckets`), each keyed in one table's key space (its `tag`, the top 8 bits of every
//! id it produces), and *dense inputs* (numeric columns with a transform). Slots are the fields
//! of a [`crate::Batch`], in plan order; dense inputs are its dense values, in plan order.
//!
//! [`InputPlan::legacy`] is the plan every schema had before feature columns: one `id` slot per
//! `sparse` column and one `bag` (sum) slot per `multi_sparse` column, slot `i` tagged `i`, and
//! every `dense` column through [`crate::log_transform`].

use serde::{Deserialize, Serialize};

use crate::error::DataError;
use crate::schema::{ColumnKind, Schema, MAX_FIELDS};

/// How a bag's rows are combined into one vector (TensorFlow's combiners).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// `sum_i w_i e_i`.
    #[default]
    Sum,
    /// `sum_i w_i e_i / sum_i w_i` (zeros when the weights sum to 0).
    Mean,
    /// `sum_i w_i e_i / sqrt(sum_i w_i^2)` (zeros when every weight is 0).
    Sqrtn,
}

/// What a slot makes of its column.
#[derive(Clone, Debug, PartialEq)]
pub enum SlotKind {
    /// One value per row (a `sparse` column); empty is the table's missing id.
    Id,
    /// Several values per row (a `multi_sparse` column), pooled. With `weighted`, every item is
    /// `value<weight_separator>weight` (an item without a weight weighs 1).
    Bag {
        /// How the rows are combined.
        pooling: Pooling,
        /// Items carry weights.
        weighted: bool,
        /// Separator between a value and its weight.
        weight_separator: u8,
    },
    /// Ordered values (a `multi_sparse` column, oldest first), at most `max_len` kept: the most
    /// recent ones (the last items). An empty sequence holds the missing id (length 1).
    Sequence {
        /// Longest sequence kept.
        max_len: usize,
    },
    /// A numeric (`dense`) column cut at `boundaries` (ascending) into an id: value `x` falls in
    /// bucket `i` = the number of boundaries `<= x`; an empty value is the missing id.
    Buckets {
        /// Ascending, finite cut points.
        boundaries: Vec<f64>,
    },
}

impl SlotKind {
    /// True for kinds whose items carry weights.
    pub fn is_weighted(&self) -> bool {
        matches!(self, SlotKind::Bag { weighted: true, .. })
    }
}

/// One sparse slot of every row.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// Feature name.
    pub name: String,
    /// Index of the schema column read.
    pub column: usize,
    /// Key space (the table's tag): top 8 bits of every id of the slot.
    pub tag: u8,
    /// What the slot makes of the column.
    pub kind: SlotKind,
}

/// How a numeric column becomes a dense input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DenseTransform {
    /// Sign-preserving `log1p` ([`crate::log_transform`]); missing is 0.
    Log1p,
    /// `(x - mean) / std`; missing is `mean` (0 after the transform).
    Standardize {
        /// Mean subtracted.
        mean: f64,
        /// Standard deviation divided by (> 0).
        std: f64,
    },
}

impl DenseTransform {
    /// Applies the transform to a parsed, finite value.
    #[inline]
    pub fn apply(self, x: f64) -> f32 {
        match self {
            DenseTransform::Log1p => crate::log_transform(x),
            DenseTransform::Standardize { mean, std } => ((x - mean) / std) as f32,
        }
    }
}

/// One dense input of every row.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseInput {
    /// Feature name.
    pub name: String,
    /// Index of the schema column read.
    pub column: usize,
    /// The transform.
    pub transform: DenseTransform,
}

/// The job's model inputs, read from a schema's columns.
#[derive(Clone, Debug, PartialEq)]
pub struct InputPlan {
    /// Sparse slots, in batch field order.
    pub slots: Vec<Slot>,
    /// Dense inputs, in batch dense order.
    pub dense: Vec<DenseInput>,
}

impl InputPlan {
    /// The plan of a schema without feature columns: every sparse column an `id` slot, every
    /// multi-sparse column a summed `bag`, slot `i` tagged `i`, every dense column `log1p`.
    pub fn legacy(schema: &Schema) -> InputPlan {
        let mut slots = Vec::new();
        let mut dense = Vec::new();
        for (column, c) in schema.columns.iter().enumerate() {
            let kind = match c.kind {
                ColumnKind::Sparse => SlotKind::Id,
                ColumnKind::MultiSparse { .. } => SlotKind::Bag {
                    pooling: Pooling::Sum,
                    weighted: false,
                    weight_separator: b':',
                },
                ColumnKind::Dense => {
                    dense.push(DenseInput {
                        name: c.name.clone(),
                        column,
                        transform: DenseTransform::Log1p,
                    });
                    continue;
                }
                ColumnKind::Label | ColumnKind::Weight | ColumnKind::Ignore => continue,
            };
            slots.push(Slot {
                name: c.name.clone(),
                column,
                tag: slots.len() as u8,
                kind,
            });
        }
        InputPlan { slots, dense }
    }

    /// Sparse slots per row (the batch's `num_fields`).
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// Dense values per row (the batch's `num_dense`).
    pub fn num_dense(&self) -> usize {
        self.dense.len()
    }

    /// True when some slot carries item weights (batches then have `weights`).
    pub fn weighted(&self) -> bool {
        self.slots.iter().any(|s| s.kind.is_weighted())
    }

    /// Checks the plan against `schema`: columns exist and have a kind the slot can read
    /// (an `id` a `sparse` column, a `bag` or `sequence` a `multi_sparse` column, `buckets` and
    /// dense inputs a `dense` column), at most [`MAX_FIELDS`] slots, sane parameters. Errors name
    /// the feature.
    pub fn validate(&self, schema: &Schema) -> Result<(), DataError> {
        let err = |m: String| Err(DataError::Schema(m));
        if self.slots.is_empty() {
            return err("the job has no sparse feature (id, bag, sequence or buckets)".into());
        }
        if self.slots.len() > MAX_FIELDS {
            return err(format!(
                "{} sparse features, at most {MAX_FIELDS} are supported",
                self.slots.len()
            ));
        }
        let column = |name: &str, i: usize| {
            schema.columns.get(i).ok_or_else(|| {
                DataError::Schema(format!("feature {name:?}: column {i} is not in the schema"))
            })
        };
        for s in &self.slots {
            let c = column(&s.name, s.column)?;
            let ok = matches!(
                (&s.kind, &c.kind),
                (SlotKind::Id, ColumnKind::Sparse)
                    | (
                        SlotKind::Bag { .. } | SlotKind::Sequence { .. },
                        ColumnKind::MultiSparse { .. },
                    )
                    | (SlotKind::Buckets { .. }, ColumnKind::Dense)
            );
            if !ok {
                let (want, hint) = match &s.kind {
                    SlotKind::Id => (
                        "a \"sparse\" column",
                        " (a \"multi_sparse\" column is read by kind = \"bag\" or \"sequence\")",
                    ),
                    SlotKind::Bag { .. } => ("a \"multi_sparse\" column", ""),
                    SlotKind::Sequence { .. } => (
                        "a \"multi_sparse\" column",
                        " (a sequence needs several values per row)",
                    ),
                    SlotKind::Buckets { .. } => ("a \"dense\" column", ""),
                };
                return err(format!(
                    "feature {:?} reads column {:?} of kind {:?}; it needs {want}{hint}",
                    s.name,
                    c.name,
                    kind_name(&c.kind)
                ));
            }
            match &s.kind {
                SlotKind::Sequence { max_len } if *max_len == 0 => {
                    return err(format!("feature {:?}: max_len must be at least 1", s.name));
                }
                SlotKind::Buckets { boundaries } => {
                    if boundaries.is_empty() {
                        return err(format!("feature {:?}: buckets need boundaries", s.name));
                    }
                    if boundaries.iter().any(|b| !b.is_finite())
                        || boundaries.windows(2).any(|w| w[0] >= w[1])
                    {
                        return err(format!(
                            "feature {:?}: boundaries must be finite and strictly ascending",
                            s.name
                        ));
                    }
                }
                SlotKind::Bag {
                    weighted: true,
                    weight_separator,
                    ..
                } => {
                    if let ColumnKind::MultiSparse { separator } = c.kind {
                        if separator as u32 == *weight_separator as u32
                            || schema.separator as u32 == *weight_separator as u32
                        {
                            return err(format!(
                                "feature {:?}: the weight separator {:?} equals a column or item separator",
                                s.name, *weight_separator as char
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        for d in &self.dense {
            let c = column(&d.name, d.column)?;
            if c.kind != ColumnKind::Dense {
                return err(format!(
                    "feature {:?} reads column {:?} of kind {:?}; a numeric feature needs a \"dense\" column",
                    d.name,
                    c.name,
                    kind_name(&c.kind)
                ));
            }
            if let DenseTransform::Standardize { mean, std } = d.transform {
                if !(mean.is_finite() && std.is_finite() && std > 0.0) {
                    return err(format!(
                        "feature {:?}: standardize needs a finite mean and a std > 0",
                        d.name
                    ));
                }
            }
        }
        Ok(())
    }
}

fn kind_name(k: &ColumnKind) -> &'static str {
    match k {
        ColumnKind::Label => "label",
        ColumnKind::Weight => "weight",
        ColumnKind::Dense => "dense",
        ColumnKind::Sparse => "sparse",
        ColumnKind::MultiSparse { .. } => "multi_sparse",
        ColumnKind::Ignore => "ignore",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Column;

    #[test]
    fn legacy_plan_of_criteo() {
        let s = Schema::criteo();
        let p = InputPlan::legacy(&s);
        p.validate(&s).unwrap();
        assert_eq!(p.num_slots(), 26);
        assert_eq!(p.num_dense(), 13);
        assert_eq!(p.slots[0].name, "C1");
        assert_eq!(p.slots[0].column, 14);
        assert_eq!(p.slots[25].tag, 25);
        assert_eq!(p.dense[0].column, 1);
        assert!(!p.weighted());
    }

    #[test]
    fn validation_names_the_feature() {
        let mut s = Schema::criteo();
        s.columns.push(Column::new(
            "hist",
            ColumnKind::MultiSparse { separator: '|' },
        ));
        let mut p = InputPlan::legacy(&s);
        p.slots[0].kind = SlotKind::Sequence { max_len: 5 };
        let e = p.validate(&s).unwrap_err().to_string();
        assert!(
            e.contains("feature \"C1\"") && e.contains("sequence"),
            "{e}"
        );
        let mut p = InputPlan::legacy(&s);
        p.slots[26].kind = SlotKind::Id;
        let e = p.validate(&s).unwrap_err().to_string();
        assert!(e.contains("\"hist\"") && e.contains("bag"), "{e}");
        let mut p = InputPlan::legacy(&s);
        p.dense[0].transform = DenseTransform::Standardize {
            mean: 0.0,
            std: 0.0,
        };
        assert!(p.validate(&s).unwrap_err().to_string().contains("std > 0"));
    }
}

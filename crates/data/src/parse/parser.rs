//! [`LineParser`]: the steps of a plan over the columns of a schema, and what they tell of
//! the rows they make.

use super::dense::Log1pTable;
use crate::batch::BatchBuilder;
use crate::features::{DenseTransform, InputPlan, SlotKind};
use crate::schema::{ColumnKind, Schema};

/// What a slot makes of its column's value.
#[derive(Clone, Debug)]
pub(super) enum SlotOp {
    Id,
    Bag { sep: u8 },
    WeightedBag { sep: u8, weight_sep: u8 },
    Sequence { sep: u8, max_len: usize },
    Buckets { boundaries: Box<[f64]> },
}

#[derive(Clone, Debug)]
pub(super) struct SlotStep {
    pub(super) column: usize,
    pub(super) tag: u8,
    pub(super) op: SlotOp,
}

#[derive(Clone, Debug)]
pub(super) struct DenseStep {
    pub(super) column: usize,
    pub(super) transform: DenseTransform,
}

/// Parses lines of one schema into the rows of one input plan.
#[derive(Clone, Debug)]
pub struct LineParser {
    pub(super) slots: Vec<SlotStep>,
    pub(super) dense: Vec<DenseStep>,
    /// The label columns, in column order.
    pub(super) labels: Vec<usize>,
    /// The sample-weight column.
    pub(super) weight: Option<usize>,
    pub(super) names: Vec<String>,
    pub(super) sep: u8,
    /// Separator inside each column's value (the line separator for single values).
    pub(super) value_seps: Vec<u8>,
    pub(super) weighted: bool,
    /// `log1p` of the small whole numbers.
    pub(super) log1p: Log1pTable,
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
            log1p: Log1pTable::new(),
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
}

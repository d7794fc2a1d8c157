//! Feature columns and named tables: `[[tables]]` and `[[features]]` in the job TOML, resolved
//! into the input plan the readers follow ([`InputPlan`]), the tables the stores hold and the
//! layout the lookup gathers into ([`Features`]).
//!
//! **Logical and physical tables.** Every `[[tables]]` entry is a *logical* table: a key space
//! (its tag is the top 8 bits of every key) with a dim and row settings. Features that name the
//! same table share its rows. Logical tables with identical settings (dim, optimizer, init,
//! admission, eviction) are stored in one *physical* hash table, the seed's sparse-domain
//! aggregation: one index, one lock per stripe per step, one part per checkpoint. Physical
//! tables are named `embedding`, `embedding.1`, ... in order of their first logical table; the
//! first-order weights of every `wide` feature live in one more physical table, `wide` (dim 1).
//! A job without `[[features]]` means the explicit config [`legacy_sections`] prints: one table
//! per sparse column (named after it, at `[embedding] dim`), all in the one physical table
//! `embedding` with the keys, checkpoints and exports of before feature columns.
//!
//! **Classes.** The lookup partitions a step's distinct keys by (shard, class), where a class is
//! (physical deep table, whether the key's table has a wide feature). Each physical table reads
//! the classes of its bit mask, so one dedup pass serves every table, and each table's rows come
//! back compact, in (shard, class) order.

use serde::{Deserialize, Serialize};
use sparta_data::features::{DenseInput, DenseTransform, InputPlan, Pooling, Slot, SlotKind};
use sparta_data::{ColumnKind, Schema};
use sparta_table::{
    Admission, Eviction, Initializer, Optimizer, RowPrecision, Storage, TableConfig,
};

use crate::error::CoreError;

/// Most classes (see the module docs) a job may have: physical deep tables x {wide, not}.
pub const MAX_CLASSES: usize = 64;

/// `[[tables]]`: a named embedding table. Unset row settings come from `[embedding]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSection {
    /// Table name (unique).
    pub name: String,
    /// Row width.
    pub dim: usize,
    /// Row optimizer (default: `[embedding] optimizer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<Optimizer>,
    /// Initial values of new rows (default: `[embedding] init`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<Initializer>,
    /// Which ids get a row (default: `[embedding] admission`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// Rows removed while training (default: `[embedding] eviction`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<Eviction>,
    /// How rows store their weights: `f32`, `f16` or `bf16` (default: `[embedding]
    /// precision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<RowPrecision>,
    /// The SSD tier: `{ ram_rows = N, disk_dir = "..." }` or `ram_bytes` (default:
    /// `[embedding] storage`). Tables with the same settings share one physical table and
    /// its budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
}

/// What a feature makes of its column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureKind {
    /// One value per row (a `sparse` column).
    Id,
    /// Multi-hot values (a `multi_sparse` column), pooled.
    Bag,
    /// Ordered values (a `multi_sparse` column, oldest first), the last `max_len` kept.
    Sequence,
    /// A number (a `dense` column), transformed.
    Numeric,
}

/// How a numeric feature is transformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transform {
    /// Sign-preserving `log1p` (the default; what dense columns always had).
    Log1p,
    /// `(x - mean) / std`.
    Standardize,
    /// An id of its table: the bucket of `x` among `boundaries`.
    Buckets,
}

/// `[[features]]`: one model input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSection {
    /// Feature name (unique).
    pub name: String,
    /// Schema column read (default: the name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    /// `id`, `bag`, `sequence` or `numeric`.
    pub kind: FeatureKind,
    /// Table of its ids (id, bag, sequence, numeric with buckets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Bag pooling: `sum` (default), `mean` or `sqrtn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooling: Option<Pooling>,
    /// Bag items are `value:weight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weighted: Option<bool>,
    /// Separator between a bag item's value and weight (default `:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_separator: Option<char>,
    /// Longest sequence kept (the most recent values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
    /// A sequence's target: the `id` feature of the same table it is compared with (din
    /// attends over the sequence's rows against the target's row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Numeric transform: `log1p` (default), `standardize` or `buckets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<Transform>,
    /// Mean for `standardize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    /// Standard deviation for `standardize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std: Option<f64>,
    /// Cut points for `buckets` (ascending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundaries: Option<Vec<f64>>,
    /// Whether the feature also gets a first-order weight per id (default: true for id, bag and
    /// buckets when the model has a wide part, else false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wide: Option<bool>,
}

impl FeatureSection {
    /// A feature of `kind` reading the column of its name, every option unset.
    pub fn new(name: impl Into<String>, kind: FeatureKind) -> Self {
        FeatureSection {
            name: name.into(),
            column: None,
            kind,
            table: None,
            pooling: None,
            weighted: None,
            weight_separator: None,
            max_len: None,
            target: None,
            transform: None,
            mean: None,
            std: None,
            boundaries: None,
            wide: None,
        }
    }

    fn column_name(&self) -> &str {
        self.column.as_deref().unwrap_or(&self.name)
    }
}

/// A logical table of the job.
#[derive(Clone, Debug, PartialEq)]
pub struct LogicalTable {
    /// Name from `[[tables]]`.
    pub name: String,
    /// Key space: the top 8 bits of its keys.
    pub tag: u8,
    /// Row width.
    pub dim: usize,
    /// Index of the physical table holding its rows (into [`Features::physical`]).
    pub physical: usize,
    /// Whether some feature on it is `wide` (its keys then have rows in the wide table too).
    pub wide: bool,
}

/// A physical table: what a store holds and a checkpoint writes.
#[derive(Clone, Debug, PartialEq)]
pub struct PhysicalTable {
    /// Its configuration (name `embedding`, `embedding.1`, ... or `wide`).
    pub config: TableConfig,
    /// Logical tables whose rows it holds (indexes into [`Features::tables`]).
    pub members: Vec<usize>,
    /// Bit `c` set: keys of class `c` have rows here.
    pub classes: u64,
}

/// Where a sparse slot's values go in the lookup.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotLayout {
    /// Feature name.
    pub name: String,
    /// Logical table (into [`Features::tables`]).
    pub table: usize,
    /// Physical deep table (into [`Features::physical`]).
    pub physical: usize,
    /// Row width.
    pub dim: usize,
    /// Start of its pooled vector in a sample's flattened embeddings.
    pub offset: usize,
    /// Pooling of its rows (a sequence is mean-pooled for the models that read one vector).
    pub pooling: Pooling,
    /// `Some(max_len)` for sequences (gathered as a `[rows x max_len x dim]` block too).
    pub sequence: Option<usize>,
    /// A sequence's target slot (`target = "..."`): an `id` slot of the same table.
    pub target: Option<usize>,
    /// Whether its ids' first-order weights enter the wide sum.
    pub wide: bool,
}

/// The resolved feature configuration of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct Features {
    /// What the readers make of each line.
    pub plan: InputPlan,
    /// Logical tables, in `[[tables]]` order (index = tag).
    pub tables: Vec<LogicalTable>,
    /// Physical tables: the deep ones, then `wide` if some feature is wide.
    pub physical: Vec<PhysicalTable>,
    /// Index of the wide physical table.
    pub wide_table: Option<usize>,
    /// One per sparse slot, in slot order.
    pub slots: Vec<SlotLayout>,
    /// Width of a sample's flattened embeddings (sum of the slots' dims).
    pub emb_width: usize,
    /// Class of each tag (see the module docs); unused tags are 0.
    pub class_of_tag: Vec<u8>,
    /// Number of classes.
    pub num_classes: usize,
    /// Per task of the model, its label column's index among the schema's label columns
    /// (`[0]`: one task on the first label column).
    pub task_labels: Vec<usize>,
}

impl Features {
    /// Class of a key.
    #[inline]
    pub fn class_of(&self, key: u64) -> usize {
        self.class_of_tag[(key >> 56) as usize] as usize
    }

    /// `Some((physical table, dim))` when every slot is a non-sequence slot of one physical
    /// table and one dim, laid out one after the other (a job without `[[features]]`): the
    /// lookup's flat fast path.
    pub fn uniform(&self) -> Option<(usize, usize)> {
        let first = self.slots.first()?;
        self.slots
            .iter()
            .enumerate()
            .all(|(j, s)| {
                s.sequence.is_none()
                    && s.physical == first.physical
                    && s.dim == first.dim
                    && s.offset == j * first.dim
            })
            .then_some((first.physical, first.dim))
    }

    /// The sequences with a target, in slot order: what an attending model (din) reads.
    pub fn attended_sequences(&self) -> Vec<sparta_nn::SequenceSpec> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(j, s)| {
                Some(sparta_nn::SequenceSpec {
                    field: j,
                    target: s.target?,
                    max_len: s.sequence?,
                })
            })
            .collect()
    }

    /// The embedding widths of the slots, in order (what the dense model reads).
    pub fn slot_dims(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.dim).collect()
    }

    /// The physical tables' configurations.
    pub fn table_configs(&self) -> Vec<TableConfig> {
        self.physical.iter().map(|p| p.config.clone()).collect()
    }

    /// Whether some slot is wide.
    pub fn has_wide(&self) -> bool {
        self.wide_table.is_some()
    }

    /// The logical table named `name`.
    pub fn table(&self, name: &str) -> Option<&LogicalTable> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The logical tables of each physical table, by its name: what checkpoints and exports
    /// record, and what a resume checks.
    pub fn members(&self) -> sparta_checkpoint::Members {
        self.physical
            .iter()
            .map(|p| {
                let m = p
                    .members
                    .iter()
                    .map(|&i| {
                        let t = &self.tables[i];
                        sparta_checkpoint::TableMember {
                            name: t.name.clone(),
                            tag: t.tag,
                            // The row width in this table (1 in the wide table).
                            dim: p.config.dim.min(t.dim),
                        }
                    })
                    .collect();
                (p.config.name.clone(), m)
            })
            .collect()
    }
}

/// Row settings shared by the tables of one physical table.
#[derive(Clone, Debug, PartialEq)]
struct RowSettings {
    dim: usize,
    optimizer: Optimizer,
    init: Initializer,
    admission: Admission,
    eviction: Option<Eviction>,
    precision: RowPrecision,
    storage: Option<Storage>,
}

/// Defaults the tables inherit (the job's `[embedding]` and `[wide]` sections, resolved).
pub struct TableDefaults<'a> {
    /// `[embedding]` as a table config (dim, optimizer, init, admission, eviction, shards, seed).
    pub embedding: &'a TableConfig,
    /// The wide table's config when the model has a first-order part.
    pub wide: Option<&'a TableConfig>,
}

/// The explicit `[[tables]]` and `[[features]]` that a job without them means: one table per
/// sparse column named after it at `dim`, an `id` feature per sparse column and a `bag` (sum) per
/// multi-sparse column, a `numeric` (`log1p`) feature per dense column; `wide` as the model says.
pub fn legacy_sections(
    schema: &Schema,
    dim: usize,
    model_wide: bool,
) -> (Vec<TableSection>, Vec<FeatureSection>) {
    let mut tables = Vec::new();
    let mut features = Vec::new();
    for c in &schema.columns {
        let kind = match c.kind {
            ColumnKind::Sparse => FeatureKind::Id,
            ColumnKind::MultiSparse { .. } => FeatureKind::Bag,
            ColumnKind::Dense => {
                features.push(FeatureSection::new(&c.name, FeatureKind::Numeric));
                continue;
            }
            ColumnKind::Label | ColumnKind::Weight | ColumnKind::Ignore => continue,
        };
        tables.push(TableSection {
            name: c.name.clone(),
            dim,
            optimizer: None,
            init: None,
            admission: None,
            eviction: None,
            precision: None,
            storage: None,
        });
        let mut f = FeatureSection::new(&c.name, kind);
        f.table = Some(c.name.clone());
        f.wide = Some(model_wide);
        features.push(f);
    }
    (tables, features)
}

/// Resolves `[[tables]]` and `[[features]]` against the schema. Errors name the table or
/// feature (unknown table, a column missing from the schema, a sequence over a single-value
/// column, options that do not apply to the kind, ...).
pub fn resolve(
    schema: &Schema,
    tables: &[TableSection],
    features: &[FeatureSection],
    defaults: &TableDefaults<'_>,
) -> Result<Features, CoreError> {
    let (settings, mut logical) = resolve_tables(tables, defaults)?;
    let slots = resolve_slots(schema, features, &mut logical, defaults)?;
    check_tables_used(&logical, &slots.layouts)?;
    let SlotsResolved {
        slots,
        mut layouts,
        dense,
        emb_width,
    } = slots;
    resolve_targets(features, &slots, &mut layouts)?;
    let plan = InputPlan { slots, dense };
    plan.validate(schema)
        .map_err(|e| CoreError::Config(e.to_string()))?;
    let classes = place_classes(settings, &logical, defaults);
    Ok(Features {
        plan,
        tables: logical,
        physical: classes.physical,
        wide_table: classes.wide_table,
        slots: layouts,
        emb_width,
        class_of_tag: classes.class_of_tag,
        num_classes: classes.num_classes,
        task_labels: vec![0],
    })
}

/// The logical tables (tag = index) and the distinct row settings they share: one physical
/// table each (a logical table's `physical` indexes them).
fn resolve_tables(
    tables: &[TableSection],
    defaults: &TableDefaults<'_>,
) -> Result<(Vec<RowSettings>, Vec<LogicalTable>), CoreError> {
    let cfg = |m: String| CoreError::Config(m);
    if tables.len() > 255 {
        return Err(cfg(format!("{} tables, at most 255", tables.len())));
    }
    let mut settings: Vec<RowSettings> = Vec::new();
    let mut logical = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        if t.name.is_empty() {
            return Err(cfg(format!("tables[{i}]: empty name")));
        }
        if tables[..i].iter().any(|o| o.name == t.name) {
            return Err(cfg(format!(
                "tables[{i}]: duplicate table name {:?}",
                t.name
            )));
        }
        if t.dim == 0 || t.dim > 4096 {
            return Err(cfg(format!(
                "table {:?}: dim = {} must be in 1..=4096",
                t.name, t.dim
            )));
        }
        let e = defaults.embedding;
        let s = RowSettings {
            dim: t.dim,
            optimizer: t.optimizer.clone().unwrap_or_else(|| e.optimizer.clone()),
            init: t.init.clone().unwrap_or_else(|| e.init.clone()),
            admission: t.admission.clone().unwrap_or_else(|| e.admission.clone()),
            eviction: t.eviction.clone().or_else(|| e.eviction.clone()),
            precision: t.precision.unwrap_or(e.precision),
            storage: t.storage.clone().or_else(|| e.storage.clone()),
        };
        if let Some(st) = &s.storage {
            st.check()
                .map_err(|m| cfg(format!("table {:?}: {m}", t.name)))?;
        }
        let physical = match settings.iter().position(|x| *x == s) {
            Some(p) => p,
            None => {
                settings.push(s);
                settings.len() - 1
            }
        };
        logical.push(LogicalTable {
            name: t.name.clone(),
            tag: i as u8,
            dim: t.dim,
            physical,
            wide: false,
        });
    }
    if settings.len() * 2 > MAX_CLASSES {
        return Err(cfg(format!(
            "{} distinct table settings (dim, optimizer, init, admission, eviction); at most {}",
            settings.len(),
            MAX_CLASSES / 2
        )));
    }
    Ok((settings, logical))
}

/// The features resolved to reader slots and lookup layouts (in slot order) and dense inputs.
struct SlotsResolved {
    slots: Vec<Slot>,
    layouts: Vec<SlotLayout>,
    dense: Vec<DenseInput>,
    /// Sum of the slots' dims.
    emb_width: usize,
}

/// Resolves every feature: a dense input (numeric, not bucketized) or a sparse slot on its
/// table (marking the table wide when the feature is).
fn resolve_slots(
    schema: &Schema,
    features: &[FeatureSection],
    logical: &mut [LogicalTable],
    defaults: &TableDefaults<'_>,
) -> Result<SlotsResolved, CoreError> {
    let cfg = |m: String| CoreError::Config(m);
    let mut out = SlotsResolved {
        slots: Vec::new(),
        layouts: Vec::new(),
        dense: Vec::new(),
        emb_width: 0,
    };
    for (i, f) in features.iter().enumerate() {
        if f.name.is_empty() {
            return Err(cfg(format!("features[{i}]: empty name")));
        }
        if features[..i].iter().any(|o| o.name == f.name) {
            return Err(cfg(format!(
                "features[{i}]: duplicate feature name {:?}",
                f.name
            )));
        }
        let column = column_of(schema, f)?;
        let transform = check_options(f)?;
        if f.kind == FeatureKind::Numeric && transform != Transform::Buckets {
            out.dense.push(dense_input(f, column, transform)?);
            continue;
        }
        let (slot, layout) = sparse_slot(f, column, logical, defaults, out.emb_width)?;
        out.emb_width += layout.dim;
        out.slots.push(slot);
        out.layouts.push(layout);
    }
    Ok(out)
}

/// The schema column a feature reads.
fn column_of(schema: &Schema, f: &FeatureSection) -> Result<usize, CoreError> {
    let name = f.column_name();
    schema
        .columns
        .iter()
        .position(|c| c.name == name)
        .ok_or_else(|| {
            CoreError::Config(format!(
                "feature {:?}: column {name:?} is not in the schema (columns: {})",
                f.name,
                schema
                    .columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Refuses the options that do not apply to a feature's kind; returns its transform (`log1p`
/// unless given).
fn check_options(f: &FeatureSection) -> Result<Transform, CoreError> {
    let not_for = |field: &str, set: bool, kinds: &str| -> Result<(), CoreError> {
        if set {
            Err(CoreError::Config(format!(
                "feature {:?}: `{field}` applies to {kinds} only",
                f.name
            )))
        } else {
            Ok(())
        }
    };
    let bag = f.kind == FeatureKind::Bag;
    not_for("pooling", f.pooling.is_some() && !bag, "kind = \"bag\"")?;
    not_for("weighted", f.weighted.is_some() && !bag, "kind = \"bag\"")?;
    not_for(
        "weight_separator",
        f.weight_separator.is_some() && !bag,
        "kind = \"bag\"",
    )?;
    not_for(
        "max_len",
        f.max_len.is_some() && f.kind != FeatureKind::Sequence,
        "kind = \"sequence\"",
    )?;
    not_for(
        "target",
        f.target.is_some() && f.kind != FeatureKind::Sequence,
        "kind = \"sequence\"",
    )?;
    not_for(
        "transform",
        f.transform.is_some() && f.kind != FeatureKind::Numeric,
        "kind = \"numeric\"",
    )?;
    let transform = f.transform.unwrap_or(Transform::Log1p);
    not_for(
        "mean/std",
        (f.mean.is_some() || f.std.is_some())
            && !(f.kind == FeatureKind::Numeric && transform == Transform::Standardize),
        "transform = \"standardize\"",
    )?;
    not_for(
        "boundaries",
        f.boundaries.is_some()
            && !(f.kind == FeatureKind::Numeric && transform == Transform::Buckets),
        "transform = \"buckets\"",
    )?;
    Ok(transform)
}

/// A numeric feature read as a dense input (`transform` is not `buckets`).
fn dense_input(
    f: &FeatureSection,
    column: usize,
    transform: Transform,
) -> Result<DenseInput, CoreError> {
    let bad = |m: String| CoreError::Config(format!("feature {:?}: {m}", f.name));
    if f.table.is_some() {
        return Err(bad(
            "a numeric feature has no table unless transform = \"buckets\"".into(),
        ));
    }
    if f.wide == Some(true) {
        return Err(bad(
            "wide = true needs ids: a numeric feature gets first-order weights only \
             with transform = \"buckets\""
                .into(),
        ));
    }
    let transform = match transform {
        Transform::Log1p => DenseTransform::Log1p,
        Transform::Standardize => DenseTransform::Standardize {
            mean: f
                .mean
                .ok_or_else(|| bad("transform = \"standardize\" needs `mean`".into()))?,
            std: f
                .std
                .ok_or_else(|| bad("transform = \"standardize\" needs `std`".into()))?,
        },
        Transform::Buckets => unreachable!("a bucketized feature is a sparse slot"),
    };
    Ok(DenseInput {
        name: f.name.clone(),
        column,
        transform,
    })
}

/// A sparse feature's reader slot and lookup layout (its pooled vector at `offset`).
fn sparse_slot(
    f: &FeatureSection,
    column: usize,
    logical: &mut [LogicalTable],
    defaults: &TableDefaults<'_>,
    offset: usize,
) -> Result<(Slot, SlotLayout), CoreError> {
    let bad = |m: String| CoreError::Config(format!("feature {:?}: {m}", f.name));
    let table_name = f
        .table
        .as_deref()
        .ok_or_else(|| bad("needs `table` (the [[tables]] entry its ids are rows of)".into()))?;
    let t = logical
        .iter()
        .position(|t| t.name == table_name)
        .ok_or_else(|| {
            bad(format!(
                "unknown table {table_name:?} (tables: {})",
                logical
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let model_wide = defaults.wide.is_some();
    let wide = f
        .wide
        .unwrap_or(model_wide && f.kind != FeatureKind::Sequence);
    if wide && !model_wide {
        return Err(bad(
            "wide = true, but the model has no first-order part (model.kind = \"dcn\")".into(),
        ));
    }
    let (kind, pooling, sequence) = slot_kind(f)?;
    if wide {
        logical[t].wide = true;
    }
    let lt = &logical[t];
    let slot = Slot {
        name: f.name.clone(),
        column,
        tag: lt.tag,
        kind,
    };
    let layout = SlotLayout {
        name: f.name.clone(),
        table: t,
        physical: lt.physical,
        dim: lt.dim,
        offset,
        pooling,
        sequence,
        target: None,
        wide,
    };
    Ok((slot, layout))
}

/// A sparse feature's slot kind, its pooling and (a sequence's) `max_len`.
fn slot_kind(f: &FeatureSection) -> Result<(SlotKind, Pooling, Option<usize>), CoreError> {
    let bad = |m: String| CoreError::Config(format!("feature {:?}: {m}", f.name));
    Ok(match f.kind {
        FeatureKind::Id => (SlotKind::Id, Pooling::Sum, None),
        FeatureKind::Bag => {
            let sep = f.weight_separator.unwrap_or(':');
            if !sep.is_ascii() {
                return Err(bad(format!("weight_separator {sep:?} must be ASCII")));
            }
            let pooling = f.pooling.unwrap_or_default();
            (
                SlotKind::Bag {
                    pooling,
                    weighted: f.weighted.unwrap_or(false),
                    weight_separator: sep as u8,
                },
                pooling,
                None,
            )
        }
        FeatureKind::Sequence => {
            let max_len = f
                .max_len
                .ok_or_else(|| bad("kind = \"sequence\" needs `max_len`".into()))?;
            if max_len == 0 || max_len > 4096 {
                return Err(bad(format!("max_len = {max_len} must be in 1..=4096")));
            }
            (SlotKind::Sequence { max_len }, Pooling::Mean, Some(max_len))
        }
        FeatureKind::Numeric => {
            let boundaries = f
                .boundaries
                .clone()
                .ok_or_else(|| bad("transform = \"buckets\" needs `boundaries`".into()))?;
            (SlotKind::Buckets { boundaries }, Pooling::Sum, None)
        }
    })
}

/// Refuses a table no feature reads.
fn check_tables_used(logical: &[LogicalTable], layouts: &[SlotLayout]) -> Result<(), CoreError> {
    for t in logical {
        if !layouts.iter().any(|s| s.table == t.tag as usize) {
            return Err(CoreError::Config(format!(
                "table {:?} is not used by any feature (remove it or name it in a feature's `table`)",
                t.name
            )));
        }
    }
    Ok(())
}

/// The physical tables and the key classes routing to them.
struct Classes {
    physical: Vec<PhysicalTable>,
    wide_table: Option<usize>,
    class_of_tag: Vec<u8>,
    num_classes: usize,
}

/// Classes: (physical deep table, wide) -> class index = 2 * physical + wide; the deep physical
/// tables (one per row settings), then the wide one when some table is wide.
fn place_classes(
    settings: Vec<RowSettings>,
    logical: &[LogicalTable],
    defaults: &TableDefaults<'_>,
) -> Classes {
    let mut class_of_tag = vec![0u8; 256];
    let mut used = 0u64;
    for t in logical {
        let c = 2 * t.physical + usize::from(t.wide);
        class_of_tag[t.tag as usize] = c as u8;
        used |= 1 << c;
    }
    let num_classes = 2 * settings.len();
    let mut physical: Vec<PhysicalTable> = settings
        .into_iter()
        .enumerate()
        .map(|(p, s)| PhysicalTable {
            config: TableConfig {
                name: if p == 0 {
                    "embedding".into()
                } else {
                    format!("embedding.{p}")
                },
                dim: s.dim,
                optimizer: s.optimizer,
                init: s.init,
                seed: defaults.embedding.seed,
                shards: defaults.embedding.shards,
                admission: s.admission,
                eviction: s.eviction,
                initial_capacity: defaults.embedding.initial_capacity,
                precision: s.precision,
                storage: s.storage,
            },
            members: logical
                .iter()
                .enumerate()
                .filter(|(_, t)| t.physical == p)
                .map(|(i, _)| i)
                .collect(),
            classes: (0b11 << (2 * p)) & used,
        })
        .collect();
    let wide_table = if logical.iter().any(|t| t.wide) {
        let w = defaults
            .wide
            .expect("a wide feature was refused above without a wide part");
        physical.push(PhysicalTable {
            config: w.clone(),
            members: logical
                .iter()
                .enumerate()
                .filter(|(_, t)| t.wide)
                .map(|(i, _)| i)
                .collect(),
            classes: (0..num_classes)
                .filter(|c| c % 2 == 1)
                .fold(0u64, |m, c| m | (1 << c))
                & used,
        });
        Some(physical.len() - 1)
    } else {
        None
    };
    Classes {
        physical,
        wide_table,
        class_of_tag,
        num_classes,
    }
}

/// Resolves each sequence's `target` to its slot: an `id` feature of the same table.
fn resolve_targets(
    features: &[FeatureSection],
    slots: &[Slot],
    layouts: &mut [SlotLayout],
) -> Result<(), CoreError> {
    for f in features {
        let Some(target) = &f.target else {
            continue;
        };
        let bad = |m: String| CoreError::Config(format!("feature {:?}: {m}", f.name));
        let at = |name: &str| layouts.iter().position(|l| l.name == name);
        let (Some(j), Some(t)) = (at(&f.name), at(target)) else {
            return Err(bad(format!("target = {target:?} is not a sparse feature")));
        };
        if !matches!(slots[t].kind, SlotKind::Id) {
            return Err(bad(format!(
                "target = {target:?} must be a kind = \"id\" feature"
            )));
        }
        if layouts[t].table != layouts[j].table {
            return Err(bad(format!(
                "target = {target:?} reads another table: a sequence and its target share one \
                 table (their rows are compared)"
            )));
        }
        layouts[j].target = Some(t);
    }
    Ok(())
}

#[cfg(test)]
mod tests;

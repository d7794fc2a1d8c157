//! Table configuration: optimizer, initializer, admission and eviction policies.

use serde::{Deserialize, Serialize};

use crate::codec::RowPrecision;
use crate::error::TableError;

/// Optimizer applied in place to a row on `push`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Optimizer {
    /// `w -= lr * g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// Per-weight Adagrad: `acc += g^2; w -= lr * g / (sqrt(acc) + eps)`.
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Initial accumulator value.
        initial_accumulator: f32,
        /// Denominator epsilon.
        eps: f32,
    },
    /// Row-wise Adagrad: one accumulator per row, `acc += mean(g^2)`.
    RowWiseAdagrad {
        /// Learning rate.
        lr: f32,
        /// Initial accumulator value.
        initial_accumulator: f32,
        /// Denominator epsilon.
        eps: f32,
    },
    /// Adam (PyTorch convention) with a per-row step count for bias correction.
    Adam {
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Denominator epsilon.
        eps: f32,
    },
    /// FTRL-Proximal (McMahan et al. 2013, learning-rate power -0.5).
    Ftrl {
        /// Learning-rate alpha.
        alpha: f32,
        /// Learning-rate beta.
        beta: f32,
        /// L1 regularisation.
        l1: f32,
        /// L2 regularisation.
        l2: f32,
    },
}

impl Optimizer {
    /// Optimizer-state floats stored per row after the `dim` weights.
    pub fn state_floats(&self, dim: usize) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Adagrad { .. } => dim,
            Optimizer::RowWiseAdagrad { .. } => 1,
            Optimizer::Adam { .. } => 2 * dim + 1,
            Optimizer::Ftrl { .. } => 2 * dim,
        }
    }
}

/// Deterministic initializer of new rows, seeded by `(key, seed)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Initializer {
    /// All weights 0.
    Zeros,
    /// All weights `value`.
    Constant {
        /// The value.
        value: f32,
    },
    /// Uniform in `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f32,
        /// Upper bound.
        high: f32,
    },
    /// Normal(mean, std) by Box-Muller.
    Normal {
        /// Mean.
        mean: f32,
        /// Standard deviation.
        std: f32,
    },
}

/// Which ids get a row on `pull`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Admission {
    /// Every id gets a row.
    Always,
    /// Admit on the `min_count`-th sighting (sightings counted in a count-min sketch).
    Count {
        /// Sightings needed.
        min_count: u32,
    },
    /// Admit each sighting with probability `p` (deterministic hash of key, seed, sighting).
    Probability {
        /// Admission probability in `[0, 1]`.
        p: f32,
    },
}

/// Row eviction policy applied by `Table::evict`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Eviction {
    /// Evict rows not pulled for more than this many steps.
    pub max_idle_steps: Option<u32>,
    /// Evict rows pulled fewer than this many times.
    pub min_count: Option<u32>,
    /// Evict rows not pulled for more than this many seconds (wall clock: the table keeps a
    /// few (step, time) samples of its clock, no time per row).
    pub max_idle_seconds: Option<f64>,
}

/// Where a table keeps rows beyond a RAM budget: the SSD tier (`storage = { ram_rows = N,
/// disk_dir = "..." }`, or `ram_bytes` instead of `ram_rows`). The budget is per table
/// instance (each PS shard of a cluster holds its own).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    /// Rows kept in RAM; the least recently pulled rows beyond it go to disk.
    pub ram_rows: Option<u64>,
    /// RAM for rows (slots and their index entries) instead of `ram_rows`.
    pub ram_bytes: Option<u64>,
    /// Directory of the cold rows' files (unnamed temporary files: gone with the process).
    pub disk_dir: std::path::PathBuf,
}

impl Storage {
    /// Checks that exactly one budget is given and `disk_dir` is a directory; the error names
    /// the field.
    pub fn check(&self) -> Result<(), String> {
        match (self.ram_rows, self.ram_bytes) {
            (Some(_), Some(_)) => {
                return Err("storage takes ram_rows or ram_bytes, not both".into())
            }
            (None, None) => return Err("storage needs ram_rows or ram_bytes".into()),
            _ => {}
        }
        if !self.disk_dir.is_dir() {
            return Err(format!(
                "storage disk_dir {} is not a directory",
                self.disk_dir.display()
            ));
        }
        Ok(())
    }
}

/// Configuration of one embedding table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TableConfig {
    /// Table name (for logs and errors).
    pub name: String,
    /// Embedding dimension.
    pub dim: usize,
    /// Optimizer applied on push.
    pub optimizer: Optimizer,
    /// Initializer of new rows.
    pub init: Initializer,
    /// Seed of the initializer and probabilistic admission.
    pub seed: u64,
    /// Number of shards; 0 = auto (64, more for huge `initial_capacity`).
    pub shards: usize,
    /// Admission policy.
    pub admission: Admission,
    /// Eviction policy, if any.
    pub eviction: Option<Eviction>,
    /// Expected number of rows (pre-sizes the index).
    pub initial_capacity: usize,
    /// How the embedding weights of a row are stored (the optimizer state stays f32).
    #[serde(skip_serializing_if = "RowPrecision::is_f32")]
    pub precision: RowPrecision,
    /// The SSD tier, if any (all rows in RAM without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
}

impl Default for TableConfig {
    fn default() -> Self {
        TableConfig {
            name: "table".into(),
            dim: 16,
            optimizer: Optimizer::Adagrad {
                lr: 0.01,
                initial_accumulator: 0.1,
                eps: 1e-8,
            },
            init: Initializer::Zeros,
            seed: 0,
            shards: 0,
            admission: Admission::Always,
            eviction: None,
            initial_capacity: 0,
            precision: RowPrecision::F32,
            storage: None,
        }
    }
}

/// Most rows one shard may hold (slot ids are 26-bit in the index).
pub const MAX_ROWS_PER_SHARD: usize = (1 << 26) - 2;

impl TableConfig {
    /// Checks ranges and consistency of all fields.
    pub fn validate(&self) -> Result<(), TableError> {
        let bad = |reason: String| {
            Err(TableError::InvalidConfig {
                table: self.name.clone(),
                reason,
            })
        };
        if self.dim == 0 || self.dim > 65536 {
            return bad(format!("dim must be in 1..=65536, got {}", self.dim));
        }
        if self.shards > 65536 {
            return bad(format!("shards must be <= 65536, got {}", self.shards));
        }
        let finite_pos = |x: f32| x.is_finite() && x >= 0.0;
        let ok = match &self.optimizer {
            Optimizer::Sgd { lr } => finite_pos(*lr),
            Optimizer::Adagrad {
                lr,
                initial_accumulator,
                eps,
            }
            | Optimizer::RowWiseAdagrad {
                lr,
                initial_accumulator,
                eps,
            } => finite_pos(*lr) && finite_pos(*initial_accumulator) && finite_pos(*eps),
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                finite_pos(*lr)
                    && (0.0..1.0).contains(beta1)
                    && (0.0..1.0).contains(beta2)
                    && finite_pos(*eps)
            }
            Optimizer::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => {
                finite_pos(*alpha)
                    && *alpha > 0.0
                    && finite_pos(*beta)
                    && finite_pos(*l1)
                    && finite_pos(*l2)
            }
        };
        if !ok {
            return bad(format!(
                "optimizer hyper-parameters out of range: {:?}",
                self.optimizer
            ));
        }
        let ok = match &self.init {
            Initializer::Zeros => true,
            Initializer::Constant { value } => value.is_finite(),
            Initializer::Uniform { low, high } => {
                low.is_finite() && high.is_finite() && low <= high
            }
            Initializer::Normal { mean, std } => mean.is_finite() && finite_pos(*std),
        };
        if !ok {
            return bad(format!("initializer out of range: {:?}", self.init));
        }
        match &self.admission {
            Admission::Always => {}
            Admission::Count { min_count } if *min_count == 0 || *min_count > u16::MAX as u32 => {
                return bad(format!(
                    "admission min_count must be in 1..=65535, got {min_count}"
                ));
            }
            Admission::Probability { p } if !(0.0..=1.0).contains(p) => {
                return bad(format!("admission p must be in [0, 1], got {p}"));
            }
            _ => {}
        }
        if let Some(e) = &self.eviction {
            if e.max_idle_steps.is_none() && e.min_count.is_none() && e.max_idle_seconds.is_none() {
                return bad("eviction needs max_idle_steps, max_idle_seconds or min_count".into());
            }
            if let Some(s) = e.max_idle_seconds {
                if !(s.is_finite() && s > 0.0) {
                    return bad(format!(
                        "eviction max_idle_seconds must be a number of seconds above 0, got {s}"
                    ));
                }
            }
            if e.max_idle_steps == Some(0) {
                return bad(
                    "eviction max_idle_steps = 0 would evict every row after every step (a row \
                     pulled this step is already idle at the scan): it must be at least 1"
                        .into(),
                );
            }
        }
        if let Some(st) = &self.storage {
            st.check().map_err(|reason| TableError::InvalidConfig {
                table: self.name.clone(),
                reason,
            })?;
        }
        Ok(())
    }

    /// Rows shard `shard` of `shards` keeps in RAM under the storage budget (`usize::MAX`
    /// without a tier): the budget split evenly, the first shards taking one more row where
    /// it does not divide, so the shards' budgets add up to it. `ram_bytes` counts a row's
    /// slot (`row_bytes`) and its index entry (4 bytes at load 0.85).
    pub fn ram_rows_of_shard(&self, shard: usize, shards: usize, row_bytes: usize) -> usize {
        let Some(st) = &self.storage else {
            return usize::MAX;
        };
        let rows = match (st.ram_rows, st.ram_bytes) {
            (Some(r), _) => r,
            (None, Some(b)) => (b as f64 / (row_bytes as f64 + 4.0 / 0.85)) as u64,
            (None, None) => u64::MAX,
        };
        let n = shards as u64;
        let mine = rows / n + u64::from((shard as u64) < rows % n);
        mine.min(usize::MAX as u64) as usize
    }

    /// Effective shard count (resolves `shards == 0`).
    pub fn effective_shards(&self) -> usize {
        if self.shards > 0 {
            return self.shards;
        }
        // Keep shards well below the per-shard slot limit for the expected size.
        let need = self.initial_capacity.div_ceil(MAX_ROWS_PER_SHARD / 4);
        need.max(64).next_power_of_two()
    }

    /// Floats per row including optimizer state (`row_stride`).
    pub fn row_floats(&self) -> usize {
        self.dim + self.optimizer.state_floats(self.dim)
    }

    /// Bytes of a row's key and stored floats: the weights at `precision`, the optimizer
    /// state as f32 (the index and slab overhead come on top).
    pub fn payload_bytes_per_row(&self) -> usize {
        let codec = crate::codec::RowCodec {
            precision: self.precision,
            dim: self.dim,
            state: self.optimizer.state_floats(self.dim),
        };
        8 + 4 * codec.stored_words()
    }
}

//! Model configuration (serde, with defaults) and its validation.

use serde::{Deserialize, Serialize};

use crate::NnError;

/// Which CTR architecture to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// Wide & Deep: logit = bias + wide sum + MLP(concat(emb, dense)).
    Wdl,
    /// DeepFM: logit = bias + wide (first order) + FM(emb) + MLP(concat(emb, dense)).
    Deepfm,
    /// Deep & Cross (v1): cross tower and MLP on x0 = concat(emb, dense), concat -> linear.
    Dcn,
}

/// Optimizer for the dense parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum DenseOptimizer {
    /// Plain SGD: w -= lr * g.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// Adagrad: a += g^2; w -= lr * g / (sqrt(a) + eps).
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Initial value of the accumulator.
        initial_accumulator: f32,
        /// Denominator epsilon.
        eps: f32,
    },
    /// Adam with bias correction: w -= lr * m_hat / (sqrt(v_hat) + eps).
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
}

impl Default for DenseOptimizer {
    fn default() -> Self {
        DenseOptimizer::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// Weight initialization of the dense layers. Biases always start at zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenseInit {
    /// Glorot/Xavier uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)). The default
    /// (as in the common TF CTR implementations).
    #[default]
    XavierUniform,
    /// He/Kaiming uniform: U(-a, a), a = sqrt(6 / fan_in).
    HeUniform,
}

impl DenseInit {
    /// Half-width of the uniform distribution for a `[fan_in, fan_out]` weight.
    pub fn limit(self, fan_in: usize, fan_out: usize) -> f32 {
        match self {
            DenseInit::XavierUniform => (6.0 / (fan_in + fan_out) as f32).sqrt(),
            DenseInit::HeUniform => (6.0 / fan_in as f32).sqrt(),
        }
    }
}

/// How `threads > 1` are used for one batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParallelMode {
    /// Split the batch rows into `threads` shards, run each shard with single-threaded GEMMs
    /// and sum the parameter gradients (measured faster on 2 cores; see `dense_bench`).
    #[default]
    Shard,
    /// One shard; every GEMM uses `gemm`'s own `Parallelism::Rayon(threads)`.
    Gemm,
}

fn default_hidden() -> Vec<usize> {
    vec![512, 256, 128]
}
fn default_cross_layers() -> usize {
    3
}
fn default_threads() -> usize {
    1
}
fn default_kind() -> ModelKind {
    ModelKind::Wdl
}

/// Configuration of a dense model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Architecture (default `wdl`).
    #[serde(default = "default_kind")]
    pub kind: ModelKind,
    /// Number of sparse fields F.
    pub num_fields: usize,
    /// Embedding dimension D (deep embeddings, per field).
    pub emb_dim: usize,
    /// Width of each field's embedding when they differ (feature columns over tables of several
    /// dims); empty means every field is `emb_dim` wide. `num_fields` entries when given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feature_dims: Vec<usize>,
    /// Number of dense (continuous) features.
    #[serde(default)]
    pub num_dense: usize,
    /// Hidden layer widths of the MLP (ReLU), default `[512, 256, 128]`.
    #[serde(default = "default_hidden")]
    pub hidden: Vec<usize>,
    /// Number of cross layers (dcn only), default 3.
    #[serde(default = "default_cross_layers")]
    pub cross_layers: usize,
    /// Dense optimizer, default Adam(lr 1e-3, 0.9, 0.999, 1e-8).
    #[serde(default)]
    pub optimizer: DenseOptimizer,
    /// Weight init, default `xavier_uniform`.
    #[serde(default)]
    pub init: DenseInit,
    /// Seed of the weight initialization.
    #[serde(default)]
    pub seed: u64,
    /// Threads used by one forward/backward (default 1).
    #[serde(default = "default_threads")]
    pub threads: usize,
    /// How the threads are used (default `shard`).
    #[serde(default)]
    pub parallel: ParallelMode,
}

impl ModelConfig {
    /// A config with all defaults for the given shape.
    pub fn new(kind: ModelKind, num_fields: usize, emb_dim: usize, num_dense: usize) -> Self {
        Self {
            kind,
            num_fields,
            emb_dim,
            feature_dims: Vec::new(),
            num_dense,
            hidden: default_hidden(),
            cross_layers: default_cross_layers(),
            optimizer: DenseOptimizer::default(),
            init: DenseInit::default(),
            seed: 0,
            threads: default_threads(),
            parallel: ParallelMode::default(),
        }
    }

    /// A config whose fields have the given embedding widths (in field order).
    pub fn with_feature_dims(kind: ModelKind, feature_dims: Vec<usize>, num_dense: usize) -> Self {
        let uniform = feature_dims
            .first()
            .copied()
            .filter(|&d| feature_dims.iter().all(|&x| x == d));
        let mut cfg = Self::new(kind, feature_dims.len(), uniform.unwrap_or(0), num_dense);
        if uniform.is_none() {
            cfg.feature_dims = feature_dims;
        }
        cfg
    }

    /// Whether every field has the same embedding width (`emb_dim`).
    pub fn uniform_dims(&self) -> bool {
        self.feature_dims.is_empty()
    }

    /// Width of the flattened embeddings of one sample (the sum of the fields' widths).
    pub fn emb_width(&self) -> usize {
        if self.feature_dims.is_empty() {
            self.num_fields * self.emb_dim
        } else {
            self.feature_dims.iter().sum()
        }
    }

    /// Width of x0 = concat(emb flattened, dense).
    pub fn input_dim(&self) -> usize {
        self.emb_width() + self.num_dense
    }

    /// Checks shapes, hyper-parameters and thread count.
    pub fn validate(&self) -> Result<(), NnError> {
        let bad = |m: String| Err(NnError::Config(m));
        if self.feature_dims.is_empty() {
            if self.num_fields == 0 || self.emb_dim == 0 {
                return bad("num_fields and emb_dim must be > 0".into());
            }
        } else {
            if self.feature_dims.len() != self.num_fields || self.feature_dims.contains(&0) {
                return bad(format!(
                    "feature_dims {:?} must hold num_fields = {} widths > 0",
                    self.feature_dims, self.num_fields
                ));
            }
            if self.kind == ModelKind::Deepfm {
                return bad(format!(
                    "deepfm's factorization machine needs every field at one embedding dim, got {:?}",
                    self.feature_dims
                ));
            }
        }
        if self.hidden.contains(&0) {
            return bad(format!("hidden widths must be > 0, got {:?}", self.hidden));
        }
        if self.kind == ModelKind::Dcn && self.cross_layers == 0 && self.hidden.is_empty() {
            return bad("dcn needs cross layers or hidden layers".into());
        }
        if self.kind != ModelKind::Dcn && self.hidden.is_empty() {
            return bad(
                "model.hidden = [] leaves the deep part without a hidden layer (a linear model \
                 over the embeddings): give at least one width, e.g. [256, 128]"
                    .into(),
            );
        }
        if self.threads == 0 || self.threads > 256 {
            return bad(format!("threads must be in 1..=256, got {}", self.threads));
        }
        let pos = |x: f32| x.is_finite() && x > 0.0;
        let unit = |x: f32| x.is_finite() && (0.0..1.0).contains(&x);
        let ok = match self.optimizer {
            DenseOptimizer::Sgd { lr } => pos(lr),
            DenseOptimizer::Adagrad {
                lr,
                initial_accumulator,
                eps,
            } => {
                pos(lr) && initial_accumulator.is_finite() && initial_accumulator >= 0.0 && pos(eps)
            }
            DenseOptimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => pos(lr) && unit(beta1) && unit(beta2) && pos(eps),
        };
        if !ok {
            return bad(format!(
                "invalid optimizer hyper-parameters: {:?}",
                self.optimizer
            ));
        }
        Ok(())
    }
}

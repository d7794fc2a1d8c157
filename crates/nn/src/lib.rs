//! `sparta-nn`: the dense half of Sparta's CTR models.
//!
//! The embedding tables live elsewhere; this crate owns the dense network (Wide&Deep, DeepFM,
//! DCN, DCN-v2, DLRM, DIN, and the multi-task MMoE and ESMM), its optimizers and the
//! evaluation metrics. Everything is f32 and GEMM-bound (via the `gemm` crate);
//! activation/gradient buffers are allocated once per batch-size capacity and reused, so a
//! steady-state step does not allocate large buffers.
//!
//! Entry point: [`Model`], built from a [`ModelConfig`].
//!
//! # Layout
//! * Parameters, gradients and optimizer state are flat `Vec<f32>`s described by
//!   [`params::ParamSpec`]s (`mlp.{i}.weight` `[in, out]`, `mlp.{i}.bias`, `cross.{l}.weight`,
//!   `cross.{l}.bias`, `head.weight`, `head.bias`, and the wide `bias` for wdl/deepfm; dcnv2's
//!   low-rank `cross.{l}.v`, `cross.{l}.u`, `cross.{l}.gate`; dlrm's `bottom.{i}.weight`,
//!   `bottom.{i}.bias`; din's attention MLP of sequence k, `attention.{k}.{i}.weight` `[in, out]`
//!   and `attention.{k}.{i}.bias` (its first layer over `4 * dim`, its last to one score);
//!   mmoe's `expert.{k}.{i}.weight`/`.bias`, `gate.{t}.weight` `[x0, K]`,
//!   `gate.{t}.bias`, `tower.{t}.{i}.weight`/`.bias` (the last `i` is the logit layer); esmm's
//!   `tower.0.*` (CTR) and `tower.1.*` (CVR); with `layer_norm`, every hidden layer of those
//!   also has `{layer}.ln.gain` (init 1) and `{layer}.ln.bias`).
//! * Weights default to Xavier/Glorot uniform ([`DenseInit::XavierUniform`]); biases start at 0.
//!
//! # Tasks and weights
//! A batch has `num_tasks` labels per row ([`ModelConfig::tasks`]; one `ctr` task by default)
//! and optional sample weights; the loss is `sum_t w_t sum_i s_i BCE_t(i) / rows` (Keras'
//! SUM_OVER_BATCH_SIZE). [`Model::predict`] writes `rows * num_tasks` probabilities. ESMM's two
//! outputs are pCTR and pCTCVR = pCTR * pCVR, trained on the click and on click * conversion
//! ([`ModelConfig::task_target`]); its CVR tower learns only through pCTCVR.
//!
//! # Layer norm and dropout
//! mmoe and esmm build their experts and towers from one MLP block: linear -> [layer norm] ->
//! ReLU -> [inverted dropout]. Dropout runs in [`Model::forward_backward`] only; its masks hash
//! (seed, optimizer step, the row's index in the whole batch, layer, unit), so they are the same
//! for any thread count and after a resume from a checkpoint.
//!
//! # Sequences (din)
//! [`ModelConfig::sequences`] names sequence fields and their target fields. With
//! [`SequencePooling::Attention`] (the default) the model [attends](Model::attends): every
//! batch carries one [`SequenceIn`] block per sequence (`rows * max_len * dim` values, each
//! row's length), the sequence field's slot of `emb` is replaced by the attention pooling of its
//! block against the target's embedding, and [`Model::forward_backward_seq`] returns the
//! blocks' gradients (the sequence slot of `d_emb` is zero, the target's includes the
//! attention's part). With [`SequencePooling::Mean`] din is an MLP over `[emb | dense]` as given
//! (the caller's mean pooling) and needs no blocks.
//!
//! # Threads
//! `threads` > 1 uses a private rayon pool. [`ParallelMode::Shard`] (default) splits the batch
//! rows into `threads` shards, each running the whole forward/backward with single-threaded
//! GEMMs into its own workspace and gradient buffer; gradients are summed in
//! [`Model::apply_gradients`]. This needs one fork/join per step and parallelizes the
//! elementwise work too. [`ParallelMode::Gemm`] instead keeps one shard and lets every GEMM use
//! `gemm`'s `Compute::rayon(threads)`. `examples/dense_bench.rs` measures both.
//! Results differ between thread counts only by float summation order; `threads = 1` is
//! bit-for-bit deterministic for a given seed.

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod bench;
pub mod config;
#[cfg(target_arch = "x86_64")]
pub mod dpbf16;
pub mod epilogue;
pub mod gemm_ops;
pub mod gradcheck;
pub mod layers;
pub mod metrics;
mod model;
mod net;
pub mod optim;
pub mod params;
mod rng;
mod simd;

pub use config::{
    CrossStructure, DenseInit, DenseOptimizer, ModelConfig, ModelKind, ParallelMode,
    SequencePooling, SequenceSpec, TaskSpec,
};
pub use gemm_ops::Precision;
pub use model::{Model, ModelBatch};
pub use net::SequenceIn;

/// Errors of the dense network crate.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// The model configuration is invalid.
    #[error("invalid model config: {0}")]
    Config(String),
    /// A named parameter does not exist.
    #[error("unknown parameter `{0}`")]
    UnknownParam(String),
    /// A buffer had the wrong length.
    #[error("length mismatch for `{name}`: expected {expected}, got {got}")]
    Length {
        /// What was being set or checked.
        name: String,
        /// Expected number of elements.
        expected: usize,
        /// Provided number of elements.
        got: usize,
    },
    /// The worker thread pool could not be built.
    #[error("thread pool: {0}")]
    ThreadPool(String),
}

//! Layers with explicit forward and backward passes over row-major `[rows, width]` buffers.
//!
//! Parameters are read from (and gradients accumulated into) flat buffers at the offsets each
//! layer was registered with (see [`crate::params::ParamLayout`]).

pub mod activation;
pub mod attention;
pub mod cross;
pub mod cross_v2;
pub mod dot;
pub mod dropout;
pub mod fm;
pub mod gate;
pub mod head;
pub mod kernels;
pub mod layer_norm;
pub mod linear;
pub mod loss;

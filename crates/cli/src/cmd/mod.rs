//! One module per subcommand.

pub mod bench;
mod bench_read;
#[cfg(feature = "bench")]
mod bench_table;
mod bench_train;
pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod coordinator;
pub mod demo;
pub mod export;
pub mod flags;
pub mod forget;
pub mod gen_data;
pub mod kafka_produce;
pub mod launch;
pub mod move_slots;
pub mod plan;
pub mod predict;
pub mod ps;
pub mod scale_ps;
pub mod serve;
pub mod train;
pub mod worker;

//! One module per subcommand.

pub mod bench;
pub mod checkpoint;
pub mod demo;
pub mod gen_data;
pub mod launch;
pub mod ps;
pub mod supervise;
pub mod train;
pub mod worker;
mod worker_ckpt;

//! One module per subcommand.

pub mod bench;
pub mod demo;
pub mod gen_data;
pub mod train;

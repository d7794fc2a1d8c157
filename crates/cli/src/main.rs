//! The `sparta` binary: the allocator, then the command line (`sparta_cli::run`).

/// mimalloc.
#[cfg(not(feature = "bench"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// With the `bench` feature: mimalloc wrapped in the table benchmark's counting allocator, so
/// `sparta bench table` can measure the bytes each structure holds.
#[cfg(feature = "bench")]
#[global_allocator]
static GLOBAL: sparta_table::bench::CountingAlloc<mimalloc::MiMalloc> =
    sparta_table::bench::CountingAlloc(mimalloc::MiMalloc);

fn main() {
    sparta_cli::run();
}

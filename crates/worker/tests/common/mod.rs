//! Helpers shared by the worker's integration tests.

use std::path::{Path, PathBuf};

/// The real Criteo sample (14,950 rows) when `../shared/data` has it, else (or with
/// `SPARTA_TESTS_SYNTHETIC=1`) as many rows of the product's own synthetic click log, written
/// into `dir`: these tests run on every machine.
pub fn sample(dir: &Path) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/criteo/criteo_kaggle_sample.tsv");
    if p.exists() && std::env::var_os("SPARTA_TESTS_SYNTHETIC").is_none() {
        return p;
    }
    let out = dir.join("synthetic-sample.tsv");
    let cfg = sparta_data::SynthConfig {
        rows: 14_950,
        seed: 11,
        vocab_scale: 0.01,
        ..Default::default()
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(&out).unwrap());
    sparta_data::write_synthetic(&cfg, &mut f).unwrap();
    std::io::Write::flush(&mut f).unwrap();
    out
}

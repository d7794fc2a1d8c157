//! The online parts of `sparta train`: serving exports as a step hook (`sparta_worker`'s
//! [`ExportHook`]) and the predictions it writes. SIGINT/SIGTERM turning into a graceful stop
//! (finish the step, checkpoint, export, exit 0) is [`crate::signals::stop_on_signals`].

use std::path::Path;

use anyhow::{Context, Result};

pub use sparta_worker::ExportHook;

/// Writes one probability per line (the format of `sparta predict`).
pub fn write_predictions(path: &Path, probs: &[f32], tasks: usize) -> Result<()> {
    use std::io::Write;
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(f);
    for row in probs.chunks(tasks.max(1)) {
        write_prediction(&mut out, row)?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One scored line: a probability per task, tab-separated, in the model's task order.
pub fn write_prediction(out: &mut impl std::io::Write, row: &[f32]) -> std::io::Result<()> {
    for (t, p) in row.iter().enumerate() {
        if t > 0 {
            out.write_all(b"\t")?;
        }
        write!(out, "{p}")?;
    }
    out.write_all(b"\n")
}

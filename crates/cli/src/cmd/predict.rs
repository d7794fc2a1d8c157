//! `sparta predict`: scores a file offline with an export, one probability per input line.

use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use sparta_data::BatchBuilder;
use sparta_serve::Snapshot;

use super::train::online::write_prediction;

/// Lines scored per batch.
const BATCH: usize = 4096;

/// Flags of `sparta predict`.
#[derive(Args, Debug, Clone)]
pub struct PredictArgs {
    /// Export directory (its newest full export and the deltas after it are loaded; a warning
    /// names newer versions that this chain cannot reach).
    #[arg(long)]
    pub model: PathBuf,
    /// Input files in the training layout (plain or gzip); the label column must be present,
    /// its value is ignored.
    #[arg(long, num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// Output: one probability per input line, in input order (header lines excluded); a
    /// multi-task model writes one per task, tab-separated, in its task order (named on
    /// stderr). A malformed line gets `nan`, so line N of the output always belongs to line N
    /// of the input; malformed lines are counted and reported.
    #[arg(long)]
    pub out: PathBuf,
}

/// The text of an input (plain, gzip or a pipe: the readers' detection).
fn open(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    sparta_data::open_text(path).with_context(|| format!("opening {}", path.display()))
}

/// Runs `sparta predict`.
pub fn run(a: PredictArgs) -> Result<()> {
    let (snap, chain) = Snapshot::load_latest_checked(&a.model)
        .with_context(|| format!("loading the export in {}", a.model.display()))?;
    if let Some(st) = chain.stale() {
        eprintln!(
            "warning: scoring with export version {} although versions up to {} exist in {}: \
             they cannot be reached ({})",
            snap.version(),
            st.newest_on_disk,
            a.model.display(),
            st.reason
        );
    }
    let schema = &snap.job().schema;
    let parser = snap.requests();
    let out =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, out);
    let (mut lines, mut bad) = (0u64, 0u64);
    let mut first_bad = None;
    // Per line of the current chunk: scored (true) or malformed (false).
    let mut ok: Vec<bool> = Vec::with_capacity(BATCH);
    let mut b = parser.builder(BATCH);
    let tasks = snap.task_names();
    let nans = vec![f32::NAN; tasks.len()];
    let flush = |b: &mut BatchBuilder, ok: &mut Vec<bool>, out: &mut BufWriter<_>| -> Result<()> {
        let probs = snap.predict(b.take());
        let mut p = probs.chunks_exact(tasks.len());
        for &good in ok.iter() {
            let row = if good {
                p.next().expect("one probability per task per scored line")
            } else {
                &nans
            };
            write_prediction(out, row)?;
        }
        ok.clear();
        Ok(())
    };
    let mut buf = Vec::new();
    for path in &a.input {
        let mut r = open(path)?;
        let mut first = true;
        loop {
            buf.clear();
            if r.read_until(b'\n', &mut buf)
                .with_context(|| format!("reading {}", path.display()))?
                == 0
            {
                break;
            }
            if std::mem::take(&mut first) && schema.header {
                continue;
            }
            let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
            lines += 1;
            match parser.parse_line(line, &mut b) {
                Ok(()) => ok.push(true),
                Err(e) => {
                    bad += 1;
                    first_bad.get_or_insert_with(|| format!("{}:{lines}: {e}", path.display()));
                    ok.push(false);
                }
            }
            if ok.len() == BATCH {
                flush(&mut b, &mut ok, &mut out)?;
            }
        }
    }
    flush(&mut b, &mut ok, &mut out)?;
    out.flush()?;
    eprintln!(
        "scored {} lines ({}) with export version {} (step {}): {bad} malformed (written as nan){}",
        lines,
        tasks.join("\t"),
        snap.version(),
        snap.step(),
        first_bad.map_or(String::new(), |f| format!(", first: {f}"))
    );
    let max_ratio = snap.job().reader.max_bad_line_ratio;
    if lines > 0 && bad as f64 > max_ratio * lines as f64 {
        bail!("{bad} of {lines} lines malformed, over the job's max_bad_line_ratio {max_ratio}");
    }
    Ok(())
}

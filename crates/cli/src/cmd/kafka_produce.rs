//! `sparta kafka-produce`: writes the lines of files to a Kafka topic, one record per line
//! (loading a topic to try `sparta train --kafka`; the producer of the tests and benchmarks).

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use sparta_data::kafka::{produce_lines, Compression, ProducerConfig};

/// `--compression`: the codec of the record batches written.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KafkaCompression {
    #[default]
    None,
    Gzip,
    Lz4,
    Snappy,
    Zstd,
}

impl From<KafkaCompression> for Compression {
    fn from(c: KafkaCompression) -> Compression {
        match c {
            KafkaCompression::None => Compression::None,
            KafkaCompression::Gzip => Compression::Gzip,
            KafkaCompression::Lz4 => Compression::Lz4,
            KafkaCompression::Snappy => Compression::Snappy,
            KafkaCompression::Zstd => Compression::Zstd,
        }
    }
}

/// Flags of `sparta kafka-produce`.
#[derive(Args, Debug, Clone)]
pub struct KafkaProduceArgs {
    /// Bootstrap brokers, host:port (comma separated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub kafka: Vec<String>,
    /// The topic (it must exist): one request of --batch records to each partition at once.
    #[arg(long)]
    pub topic: String,
    /// Files whose lines become records (plain or gzip), in order.
    #[arg(long, num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// Records per produce request.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Records per second at most (default: as fast as the broker takes them).
    #[arg(long)]
    pub rate: Option<f64>,
    /// The codec of the record batches written.
    #[arg(long, value_enum, default_value_t = KafkaCompression::None)]
    pub compression: KafkaCompression,
    /// Write what was produced as JSON here (records, bytes, seconds, next offset per partition).
    #[arg(long)]
    pub report_json: Option<PathBuf>,
}

/// `sparta kafka-produce`.
pub fn run(a: KafkaProduceArgs) -> Result<()> {
    anyhow::ensure!(
        a.batch > 0,
        "--batch 0: expected at least 1 record per request"
    );
    if let Some(r) = a.rate {
        anyhow::ensure!(
            r.is_finite() && r > 0.0,
            "--rate {r}: expected records per second > 0"
        );
    }
    let mut texts = Vec::new();
    for path in &a.input {
        texts.push(
            sparta_data::open_text(path).with_context(|| format!("--input {}", path.display()))?,
        );
    }
    // Read lazily (a large input is never held whole); the first read error ends the lines.
    let mut failed = None;
    let lines = texts
        .into_iter()
        .zip(&a.input)
        .flat_map(|(text, path)| text.split(b'\n').map(move |l| (l, path)))
        .map_while(|(line, path)| match line {
            Ok(l) => Some(l),
            Err(e) => {
                failed = Some(format!("reading {}: {e}", path.display()));
                None
            }
        })
        .filter(|l| !l.is_empty());
    let cfg = ProducerConfig {
        brokers: a.kafka.clone(),
        topic: a.topic.clone(),
        batch: a.batch,
        rate: a.rate,
        compression: a.compression.into(),
    };
    let r = produce_lines(&cfg, lines)?;
    if let Some(e) = failed {
        anyhow::bail!("{e} (after {} records were produced)", r.records);
    }
    println!(
        "produced {} records ({:.1} MiB) to {} in {:.2}s ({:.0} records/s)",
        r.records,
        r.bytes as f64 / (1 << 20) as f64,
        a.topic,
        r.seconds,
        r.records as f64 / r.seconds.max(1e-9)
    );
    if let Some(path) = &a.report_json {
        let v = serde_json::json!({
            "records": r.records,
            "bytes": r.bytes,
            "seconds": r.seconds,
            "ends": r.ends,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

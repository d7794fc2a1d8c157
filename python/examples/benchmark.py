"""The Python package's figures in BENCHMARKS.md (build it with `maturin develop --release`
and the binary with `cargo build --release -p sparta` first):

* `predict` rows/s from Python on a DataFrame vs `sparta predict` on the same rows (TSV);
* training samples/s from an Arrow iterator (RecordBatches of a Table) vs from the TSV file.

    python python/examples/benchmark.py [--rows 100000] [--train-rows 500000] [--out DIR]
"""

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa

import sparta

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def sparta_bin() -> str:
    return os.environ.get("SPARTA_BIN", str(ROOT / "target" / "release" / "sparta"))


def sh(*args: str) -> float:
    t = time.perf_counter()
    subprocess.run([sparta_bin(), *args], check=True, capture_output=True)
    return time.perf_counter() - t


def best(f, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000, help="rows scored")
    ap.add_argument("--train-rows", type=int, default=500_000)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="sparta-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    train, test = out / "train.tsv", out / "test.tsv"
    sh("gen-data", "--rows", str(a.train_rows), "--seed", "1", "--out", str(train))
    sh("gen-data", "--rows", str(a.rows), "--seed", "2", "--out", str(test))
    job = {"model": {"kind": "wdl"}}

    # Training: the TSV file (the engine's parser threads) vs an Arrow iterator.
    from_file = sparta.train(job, train, log_progress=False)
    table = pa.Table.from_pandas(
        pd.read_csv(train, sep="\t", header=None, names=CRITEO), preserve_index=False
    )
    from_arrow = sparta.train(job, iter(table.to_batches(max_chunksize=65536)), log_progress=False)
    for name, s in (("TSV file", from_file), ("Arrow iterator", from_arrow)):
        print(
            f"train from {name}: {s['train_rows']} rows, {s['train_samples_per_sec']:.0f} "
            f"samples/s end to end, {s['loop_samples_per_sec']:.0f} samples/s training loop"
        )

    # Predict: an export of that model, 100k rows from Python vs `sparta predict`.
    exp = out / "export"
    sparta.train(job, train, export_dir=exp, log_progress=False, max_rows=100_000)
    model = sparta.Model(exp)
    df = pd.read_csv(test, sep="\t", header=None, names=CRITEO)
    py = best(lambda: model.predict(df))
    rb = pa.Table.from_pandas(df, preserve_index=False).combine_chunks().to_batches()[0]
    py_rb = best(lambda: model.predict(rb))
    cli = min(
        sh("predict", "--model", str(exp), "--input", str(test), "--out", str(out / "p.txt"))
        for _ in range(3)
    )
    n = len(df)
    print(f"predict {n} rows: Python DataFrame {n / py:.0f} rows/s ({py:.3f}s), "
          f"Python RecordBatch {n / py_rb:.0f} rows/s ({py_rb:.3f}s), "
          f"sparta predict {n / cli:.0f} rows/s ({cli:.3f}s, process incl. load)")


if __name__ == "__main__":
    main()

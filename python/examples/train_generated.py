"""Train on generated data from Python, print the metrics, and plot the training loss by
samples and a calibration curve (with matplotlib, when it is installed).

    python python/examples/train_generated.py [--rows 200000] [--out DIR]

Data comes from `sparta gen-data` (the binary: SPARTA_BIN or target/{release,debug}/sparta).
"""

import argparse
import logging
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import sparta

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def sparta_bin() -> str:
    if "SPARTA_BIN" in os.environ:
        return os.environ["SPARTA_BIN"]
    for profile in ("release", "debug"):
        p = ROOT / "target" / profile / "sparta"
        if p.is_file():
            return str(p)
    raise SystemExit("no sparta binary: cargo build --release -p sparta, or set SPARTA_BIN")


def gen(path: Path, rows: int, seed: int) -> Path:
    subprocess.run(
        [sparta_bin(), "gen-data", "--rows", str(rows), "--seed", str(seed), "--out", str(path)],
        check=True,
    )
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--out", type=Path, default=None, help="where data, exports and plots go")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    out = args.out or Path(tempfile.mkdtemp(prefix="sparta-example-"))
    out.mkdir(parents=True, exist_ok=True)
    train = gen(out / "train.tsv", args.rows, 1)
    test = pd.read_csv(gen(out / "test.tsv", max(args.rows // 10, 2000), 2), sep="\t", header=None, names=CRITEO)

    job = sparta.Job.from_dict({"model": {"kind": "dcn"}, "data": {"batch_size": 1024}})
    curve = []  # (samples, recent loss), from the progress callback
    summary = sparta.train(
        job,
        train,
        test=test,
        export_dir=out / "export",
        progress=lambda info: curve.append((info["samples"], info["loss"])),
        progress_every=0.2,
    )
    print(f"trained {summary['train_rows']} rows in {summary['train_seconds']:.1f}s "
          f"({summary['train_samples_per_sec']:.0f} samples/s)")
    print(f"test AUC {summary['test_auc']:.4f}, logloss {summary['test_logloss']:.4f}")

    model = sparta.Model(out / "export")
    p = model.predict(test)
    y = test["label"].to_numpy()
    tables = model.tables()
    print(f"{model}: AUC {auc(y, p):.4f} on {len(y)} test rows; {len(tables)} tables, "
          f"{sum(t['rows'] for t in tables.values())} rows")
    plot(out, curve, y, p)


def auc(y: np.ndarray, p: np.ndarray) -> float:
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p))
    ranks[order] = np.arange(1, len(p) + 1)
    pos = y == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def plot(out: Path, curve, y, p) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot([c[0] for c in curve], [c[1] for c in curve])
    a1.set(xlabel="samples", ylabel="training loss (moving average)", title="training loss")
    bins = np.quantile(p, np.linspace(0, 1, 11))
    idx = np.clip(np.digitize(p, bins[1:-1]), 0, 9)
    mean_p = [p[idx == i].mean() for i in range(10)]
    rate = [y[idx == i].mean() for i in range(10)]
    a2.plot(mean_p, rate, marker="o", label="model")
    a2.plot([0, max(mean_p)], [0, max(mean_p)], "--", label="perfect")
    a2.set(xlabel="predicted", ylabel="observed click rate", title="calibration (deciles)")
    a2.legend()
    fig.tight_layout()
    path = out / "training.png"
    fig.savefig(path)
    print(f"plots: {path}")


if __name__ == "__main__":
    main()

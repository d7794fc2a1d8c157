"""Shared fixtures: the `sparta` binary (to make data and to compare with the CLI) and small
generated data sets. Data comes from `sparta gen-data`, so these tests need the binary:
SPARTA_BIN, default target/debug/sparta (scripts/test-python.sh builds it)."""

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def sparta_bin() -> Path:
    p = Path(os.environ.get("SPARTA_BIN", ROOT / "target" / "debug" / "sparta"))
    if not p.is_file():
        raise RuntimeError(
            f"the sparta binary is not at {p}: build it (cargo build -p sparta) or set SPARTA_BIN"
        )
    return p


def run_sparta(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([str(sparta_bin()), *args], capture_output=True, text=True)
    assert r.returncode == 0, f"sparta {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


def gen_data(path: Path, rows: int, seed: int) -> Path:
    run_sparta("gen-data", "--rows", str(rows), "--seed", str(seed), "--out", str(path))
    return path


def read_tsv(path: Path) -> pd.DataFrame:
    """A Criteo TSV as a DataFrame with inferred dtypes (ints, floats with NaN, strings)."""
    return pd.read_csv(path, sep="\t", header=None, names=CRITEO)


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return {
        "train": gen_data(d / "train.tsv", 3000, 1),
        "test": gen_data(d / "test.tsv", 1000, 2),
    }


# A small, fast job: one reader thread, so batches come in the file's order.
JOB = {
    "data": {"batch_size": 256, "reader_threads": 1},
    "model": {"kind": "wdl"},
    "train": {"threads": 2, "seed": 7},
}

import numpy as np
import pyarrow as pa
import pytest

import sparta
from conftest import JOB, read_tsv, run_sparta


@pytest.fixture(scope="module")
def export(data, tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    s = sparta.train(JOB, data["train"], export_dir=d / "exp", log_progress=False)
    assert s["exports"]["count"] >= 1
    return d / "exp"


def test_python_predict_equals_sparta_predict(export, data, tmp_path):
    out = tmp_path / "cli.txt"
    run_sparta("predict", "--model", str(export), "--input", str(data["test"]), "--out", str(out))
    cli = np.loadtxt(out, dtype=np.float64)
    m = sparta.Model(export)
    df = read_tsv(data["test"])
    got = m.predict(df)
    assert got.dtype == np.float32 and got.shape == (1000,)
    np.testing.assert_allclose(got, cli, rtol=0, atol=1e-6)
    # Without the label column, as a RecordBatch, and as a list of dicts (serving's rows).
    np.testing.assert_allclose(m.predict(pa.RecordBatch.from_pandas(df.drop(columns=["label"]))), got, atol=0)
    rows = [{k: v for k, v in r.items() if v == v} for r in df.head(5).to_dict("records")]
    np.testing.assert_allclose(m.predict(rows), got[:5], atol=1e-6)


def test_tables_version_and_reload(export, data):
    m = sparta.Model(export)
    tables = m.tables()
    assert tables and all(t["rows"] > 0 and t["dim"] > 0 for t in tables.values())
    v = m.version
    assert m.reload() is False and m.version == v
    assert m.task_names == ["ctr"]
    assert m.job.to_dict()["model"]["kind"] == "wdl"


def test_reload_finds_a_newer_version(data, tmp_path):
    exp = tmp_path / "exp"
    sparta.train(JOB, data["train"], export_dir=exp, log_progress=False, checkpoint_dir=tmp_path / "ck")
    m = sparta.Model(exp)
    first = m.version
    # The next epoch, resumed from the checkpoint, exports the next version.
    sparta.train(JOB, data["train"], epochs=2, export_dir=exp, resume=tmp_path / "ck", log_progress=False)
    assert m.reload() is True and m.version > first


def test_bad_predict_input_raises(export, data):
    m = sparta.Model(export)
    df = read_tsv(data["test"]).head(3)
    with pytest.raises(ValueError, match='no column "C3"'):
        m.predict(df.drop(columns=["C3"]))
    with pytest.raises(ValueError):
        m.predict([{"I1": "not a number"}])
    with pytest.raises(FileNotFoundError):
        sparta.Model(export.parent / "absent")
    bad = df.copy()
    bad["I2"] = [1.0, float("inf"), 2.0]
    p = m.predict(bad)
    assert np.isnan(p[1]) and not np.isnan(p[0])


def test_multi_task_predict_is_a_dict_per_task(tmp_path):
    import pandas as pd

    from conftest import ROOT

    rich = tmp_path / "rich.tsv"
    run_sparta("gen-data", "--profile", "rich", "--rows", "1500", "--out", str(rich))
    job = sparta.Job.from_path(ROOT / "examples" / "rich.toml").with_overrides(
        {
            "data": {"batch_size": 256, "reader_threads": 1},
            "model": {"kind": "mmoe"},
            "tasks": [{"name": "ctr", "label": "label"}, {"name": "ctcvr", "label": "conversion"}],
        }
    )
    assert job.task_names == ["ctr", "ctcvr"]
    exp = tmp_path / "exp"
    s = sparta.train(job, rich, test=rich, export_dir=exp, log_progress=False)
    assert set(s["test_tasks"]) == {"ctr", "ctcvr"}
    m = sparta.Trainer(job, resume=exp.parent / "none", resume_if_present=True).evaluate(rich)
    assert set(m["tasks"]) == {"ctr", "ctcvr"}
    df = pd.read_csv(rich, sep="\t", header=None, names=[c for c, _ in job.columns])
    p = sparta.Model(exp).predict(df)
    assert set(p) == {"ctr", "ctcvr"} and all(v.shape == (1500,) for v in p.values())

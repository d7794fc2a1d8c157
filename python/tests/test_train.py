import pyarrow as pa
import pytest

import sparta
from conftest import JOB, read_tsv


def frames(df, rows_per_frame):
    for i in range(0, len(df), rows_per_frame):
        yield df.iloc[i : i + rows_per_frame]


def test_dataframes_train_as_the_tsv_of_the_same_rows(data, tmp_path):
    df = read_tsv(data["train"])
    from_tsv = sparta.train(JOB, data["train"], test=data["test"], log_progress=False)
    # Frames of an odd size: batches are cut across them as the file reader cuts lines.
    from_frames = sparta.train(JOB, frames(df, 777), test=read_tsv(data["test"]), log_progress=False)
    assert from_frames["train_rows"] == from_tsv["train_rows"] == 3000
    assert from_frames["steps"] == from_tsv["steps"]
    assert abs(from_frames["test_auc"] - from_tsv["test_auc"]) < 1e-4
    assert abs(from_frames["train_loss"] - from_tsv["train_loss"]) < 1e-4
    assert from_tsv["test_auc"] > 0.6


def test_record_batches_and_tables_train_too(data):
    table = pa.Table.from_pandas(read_tsv(data["train"]), preserve_index=False)
    s = sparta.train(JOB, [table.slice(0, 1000), *table.slice(1000).to_batches(max_chunksize=500)], log_progress=False)
    assert s["train_rows"] == 3000


def test_evaluate_gives_the_metrics_per_task_and_from_a_checkpoint(data, tmp_path):
    t = sparta.Trainer(JOB, checkpoint_dir=tmp_path / "ck")
    seen = []
    s = t.train(data["train"], progress=seen.append, log_progress=False)
    assert seen and seen[-1]["done"] and seen[-1]["samples"] == 3000
    m = t.evaluate(read_tsv(data["test"]))
    assert m["rows"] == 1000 and 0.5 < m["auc"] <= 1 and m["logloss"] > 0
    assert set(m["tasks"]) == {"ctr"} and m["tasks"]["ctr"]["auc"] == m["auc"]
    again = sparta.evaluate(JOB, data["test"], checkpoint=tmp_path / "ck")
    assert abs(again["auc"] - m["auc"]) < 1e-9
    assert s["last_checkpoint"] is not None
    with pytest.raises(RuntimeError, match="trained already"):
        t.train(data["train"])


def test_gauc_by_a_column(data):
    job = sparta.Job.from_dict(JOB).with_overrides({"train": {"gauc_by": "C1"}})
    s = sparta.train(job, data["train"], test=data["test"], log_progress=False)
    assert s["test_gauc"] is not None


def test_bad_frames_raise_clear_exceptions(data):
    df = read_tsv(data["train"]).head(600)
    with pytest.raises(ValueError, match='no column "C26"'):
        sparta.train(JOB, [df.drop(columns=["C26"])], log_progress=False)
    bad = df.copy()
    bad["label"] = 3
    with pytest.raises(ValueError, match="too many bad lines.*frame 1:1: label"):
        sparta.train(JOB, [bad], log_progress=False)
    with pytest.raises(TypeError, match="DataFrame"):
        sparta.train(JOB, [object()], log_progress=False)

    def broken():
        yield df
        raise KeyError("from the user's iterator")

    with pytest.raises(KeyError, match="user's iterator"):
        sparta.train(JOB, broken(), log_progress=False)
    with pytest.raises(ValueError, match="epochs"):
        sparta.train(JOB, iter([df]), epochs=2)
    with pytest.raises(FileNotFoundError):
        sparta.train(JOB, "/nonexistent/train.tsv")


def test_a_progress_callback_that_raises_stops_training(data):
    def cb(info):
        raise ZeroDivisionError("stop here")

    with pytest.raises(ZeroDivisionError):
        sparta.train(JOB, data["train"], progress=cb, log_progress=False)


def test_progress_goes_to_python_logging(data, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="sparta")
    sparta.train(JOB, data["train"], checkpoint_dir=None)
    assert any(r.name == "sparta" for r in caplog.records)


def test_chunked_csv_readers_and_record_batch_readers_are_iterables_of_frames(data):
    import pandas as pd

    from conftest import CRITEO

    chunks = pd.read_csv(data["train"], sep="\t", header=None, names=CRITEO, chunksize=700)
    assert sparta.train(JOB, chunks, log_progress=False)["train_rows"] == 3000
    table = pa.Table.from_pandas(read_tsv(data["train"]), preserve_index=False)
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=900))
    assert sparta.train(JOB, reader, log_progress=False)["train_rows"] == 3000


def test_the_gil_is_released_while_rust_trains(data):
    import threading

    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(1)

    th = threading.Thread(target=count)
    th.start()
    try:
        s = sparta.train(JOB, data["train"], epochs=3, log_progress=False)
    finally:
        done.set()
        th.join()
    # A Python thread kept running through the whole run (with the GIL held by train it could
    # only run in the switch intervals of the wrapper's own Python code).
    assert s["train_rows"] == 9000 and len(ticks) > 100_000, len(ticks)

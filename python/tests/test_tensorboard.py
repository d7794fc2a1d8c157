"""`sparta train --tensorboard DIR`: the event file it writes is read back by TensorBoard's
own reader (EventAccumulator), with the tags, steps and values the run trained."""

import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import run_sparta

BATCH = 256
EVERY = 5


def test_train_tensorboard_scalars_read_back_by_tensorboard(data, tmp_path):
    board = tmp_path / "board"
    summary_json = tmp_path / "summary.json"
    run_sparta(
        "train", "--train", str(data["train"]),
        "--batch-size", str(BATCH), "--reader-threads", "1", "--threads", "2",
        "--tensorboard", str(board), "--tensorboard-every-steps", str(EVERY),
        "--summary-json", str(summary_json), "--quiet",
    )
    summary = json.loads(summary_json.read_text())
    rows, steps = summary["train_rows"], summary["steps"]
    assert rows == 3000 and steps == 12  # 3000 rows in batches of 256: 11 full, 1 of 184

    files = list(board.iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents."), files
    acc = EventAccumulator(str(board))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ["train/rows", "train/samples_per_sec",
                "table/embedding/rows", "table/embedding/bytes", "table/embedding/evicted"]:
        assert tag in tags, (tag, sorted(tags))
    # Every table has its three series, and progressive validation its window and cumulative
    # series: the last window AUC is the summary's.
    tables = {t.split("/")[1] for t in tags if t.startswith("table/")}
    assert {f"table/{n}/{m}" for n in tables for m in ("rows", "bytes", "evicted")} <= tags
    for tag in ["progressive/ctr/auc", "progressive/ctr/logloss",
                "progressive_cumulative/ctr/auc"]:
        assert tag in tags, (tag, sorted(tags))
    last_auc = acc.Scalars("progressive/ctr/auc")[-1]
    assert last_auc.step == steps
    window_auc = summary["progressive"]["tasks"][0]["window"]["auc"]
    assert abs(last_auc.value - window_auc) < 1e-6, (last_auc.value, window_auc)

    # Every EVERY steps, and once at the end of training.
    written = [*range(EVERY, steps + 1, EVERY), steps]
    train_rows = acc.Scalars("train/rows")
    assert [e.step for e in train_rows] == written
    assert [e.value for e in train_rows] == [s * BATCH for s in written[:-1]] + [rows]
    assert train_rows[-1].value == rows
    # The rate needs a previous write: from the second on.
    rate = acc.Scalars("train/samples_per_sec")
    assert [e.step for e in rate] == written[1:]
    assert all(e.value > 0 for e in rate)
    for n in tables:
        table_rows = acc.Scalars(f"table/{n}/rows")
        assert [e.step for e in table_rows] == written
        assert all(e.value > 0 for e in table_rows), n
        assert all(e.value > 0 for e in acc.Scalars(f"table/{n}/bytes")), n
        assert all(e.value == 0 for e in acc.Scalars(f"table/{n}/evicted")), n
    # Rows only grow without eviction.
    values = [e.value for e in acc.Scalars("table/embedding/rows")]
    assert values == sorted(values)

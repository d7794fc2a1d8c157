"""sparta.train_worker: a PS-cluster worker in this process against real `sparta ps` shards
on loopback (the same worker as `sparta worker`)."""

import os
import queue
import subprocess
import threading

import pytest

import sparta
from conftest import JOB, sparta_bin

TOKEN = "python-worker-test-token"


class Shard:
    """One `sparta ps` process; its stdout is read on a thread (the bound address, then
    drained so the process never blocks on a full pipe)."""

    def __init__(self, shard: int, num_shards: int, config, log_path) -> None:
        env = dict(os.environ, SPARTA_TOKEN=TOKEN)
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [
                str(sparta_bin()),
                "ps",
                "--shard",
                str(shard),
                "--num-shards",
                str(num_shards),
                "--listen",
                "127.0.0.1:0",
                "--config",
                str(config),
                "--workers",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        self._lines: "queue.Queue[str | None]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def address(self, timeout: float = 60.0) -> str:
        """The address from the `sparta ps shard N listening on ADDR` line."""
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no 'listening on' line in {timeout} s: {self.log()}")
            if line is None:
                raise AssertionError(f"sparta ps exited ({self.proc.wait()}): {self.log()}")
            if "listening on " in line:
                return line.split("listening on ", 1)[1].strip()

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._log.close()


@pytest.fixture
def cluster(tmp_path):
    """2 PS shards of JOB for 1 worker: (job, shard addresses)."""
    job = sparta.Job.from_dict(JOB)
    config = tmp_path / "job.toml"
    config.write_text(job.to_toml())
    shards = []
    try:
        for i in range(2):
            shards.append(Shard(i, 2, config, tmp_path / f"ps{i}.log"))
        yield job, [s.address() for s in shards]
    finally:
        for s in shards:
            s.stop()


def test_train_worker_trains_on_two_shards(cluster, data):
    job, ps = cluster
    s = sparta.train_worker(
        job, ps, rank=0, num_workers=1, train=data["train"], test=data["test"],
        token=TOKEN, quiet=True,
    )
    assert s["train_rows"] == 3000
    assert s["ps_shards"] == 2
    assert s["rank"] == 0 and s["workers"] == 1
    assert s["test_auc"] > 0.6, s
    assert s["wire"]["rpcs"] > 0, s["wire"]


def test_train_worker_needs_a_token(data, monkeypatch):
    monkeypatch.delenv("SPARTA_TOKEN", raising=False)
    with pytest.raises(ValueError, match="no token.*SPARTA_TOKEN"):
        sparta.train_worker(JOB, "127.0.0.1:1", 0, 1, train=data["train"])
    with pytest.raises(ValueError, match="wire_compression"):
        sparta.train_worker(
            JOB, "127.0.0.1:1", 0, 1, train=data["train"], token=TOKEN, wire_compression="zip"
        )

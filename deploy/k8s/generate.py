#!/usr/bin/env python3
"""Writes a Kustomize overlay of deploy/k8s/base for a shard count, a worker count and a
replica count, given once here and carried to every field and flag that depends on them:

  PS Job         completions, parallelism, --num-shards, --workers, --replicas, --peers,
                 --memory-limit (the container's memory limit, less 4 GiB for what the cap
                 does not count, split over the --replicas copies each pod holds)
  PS budget      minAvailable (shards - 1; every shard with --replicas 1)
  coordinator    --ps, --replicas
  workers Job    completions, parallelism, --num-workers, --ps

  deploy/k8s/generate.py --ps 4 --workers 3 --replicas 2 --out deploy/k8s/overlays/example
  deploy/k8s/generate.py --check deploy/k8s/overlays/example

The overlay is JSON 6902 patches on the base: each replaces one field or one argument, found
in the base by its flag, after a `test` of the base's value there, so that an overlay written
for another base fails to render instead of rendering something else (write it again). The
command that wrote an overlay is its kustomization's first lines; --check writes it again in
memory and compares (exit 1 with a diff when they differ). Needs PyYAML.
"""

import argparse
import difflib
import json
import os
import re
import sys

import yaml

BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "base")
# Memory of a PS pod its --memory-limit does not count: the push log, replication queues,
# gRPC buffers, checkpoint writing, the binary (README: "A memory cap per shard").
HEADROOM_MIB = 4096
PORT = 7070
COMMAND_LINE = re.compile(r"^#   (?:python3 )?deploy/k8s/generate\.py (.*)$", re.M)


def load(name):
    with open(os.path.join(BASE, name), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(docs, kind, name):
    for d in docs:
        if d.get("kind") == kind and d["metadata"]["name"] == name:
            return d
    raise SystemExit(f"the base has no {kind} {name}")


def mib(quantity):
    """A memory quantity (`16Gi`, `512Mi`) in MiB."""
    m = re.fullmatch(r"(\d+)(Mi|Gi|Ti)", str(quantity))
    if not m:
        raise SystemExit(f"the PS memory limit {quantity!r}: write it in Mi, Gi or Ti")
    return int(m.group(1)) * {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}[m.group(2)]


def size(mebibytes):
    """MiB as `sparta ps --memory-limit` reads it (GiB when whole)."""
    if mebibytes % 1024 == 0:
        return f"{mebibytes // 1024}GiB"
    return f"{mebibytes}MiB"


class Patch:
    """The JSON 6902 operations on one resource of the base."""

    def __init__(self, doc, title):
        self.doc = doc
        self.title = title
        self.ops = []

    def field(self, path, value):
        """Replaces the field at `path` (a list of keys and indexes) with `value`."""
        base = self.doc
        for p in path:
            base = base[p]
        pointer = "/" + "/".join(str(p) for p in path)
        self.ops.append(("test", pointer, base))
        self.ops.append(("replace", pointer, value))

    def arg(self, container, flag, value):
        """Replaces `--flag=...` in the args of `container` with `--flag=value`."""
        spec = self.doc["spec"]["template"]["spec"]
        index = next(i for i, c in enumerate(spec["containers"]) if c["name"] == container)
        args = spec["containers"][index]["args"]
        at = [i for i, a in enumerate(args) if str(a).startswith(f"{flag}=")]
        if len(at) != 1:
            raise SystemExit(
                f"the base's {container} container has {len(at)} {flag}=... argument(s), "
                "not one (write every counted flag as --flag=value)"
            )
        self.field(["spec", "template", "spec", "containers", index, "args", at[0]], f"{flag}={value}")

    def text(self):
        out = [f"# {self.title}\n"]
        for op, path, value in self.ops:
            out.append(f"- op: {op}\n  path: {path}\n  value: {json.dumps(value)}\n")
        return "".join(out)


def overlay(ps, workers, replicas, out):
    """The overlay's files: {name: text}."""
    if ps < 1 or workers < 1 or not 1 <= replicas <= ps:
        raise SystemExit("need --ps >= 1, --workers >= 1 and 1 <= --replicas <= --ps")
    addrs = ",".join(f"sparta-ps-{i}.sparta-ps:{PORT}" for i in range(ps))
    counts = f"{ps} shard(s), {workers} worker(s), {replicas} copies of every shard"

    ps_job = find(load("ps.yaml"), "Job", "sparta-ps")
    limit = ps_job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    cap = (mib(limit) - HEADROOM_MIB) // replicas
    if cap <= 0:
        raise SystemExit(f"a PS memory limit of {limit} leaves no table memory")
    p = Patch(ps_job, f"The PS shards: {counts}.")
    p.field(["spec", "completions"], ps)
    p.field(["spec", "parallelism"], ps)
    p.arg("ps", "--num-shards", ps)
    p.arg("ps", "--workers", workers)
    p.arg("ps", "--replicas", replicas)
    p.arg("ps", "--peers", addrs)
    p.arg("ps", "--memory-limit", size(cap))

    budget = Patch(
        find(load("pdb.yaml"), "PodDisruptionBudget", "sparta-ps"),
        "At most one PS pod down by choice at a time; none with --replicas 1.",
    )
    budget.field(["spec", "minAvailable"], ps - 1 if replicas > 1 else ps)

    coord = Patch(
        find(load("coordinator.yaml"), "Deployment", "sparta-coordinator"),
        f"The coordinator: {counts}.",
    )
    coord.arg("coordinator", "--ps", addrs)
    coord.arg("coordinator", "--replicas", replicas)

    w = Patch(find(load("workers.yaml"), "Job", "sparta-workers"), f"The workers: {counts}.")
    w.field(["spec", "completions"], workers)
    w.field(["spec", "parallelism"], workers)
    w.arg("worker", "--num-workers", workers)
    w.arg("worker", "--ps", addrs)

    base = os.path.relpath(BASE, os.path.abspath(out))
    patches = [
        ("ps.yaml", "batch", "Job", "sparta-ps", p),
        ("pdb.yaml", "policy", "PodDisruptionBudget", "sparta-ps", budget),
        ("coordinator.yaml", "apps", "Deployment", "sparta-coordinator", coord),
        ("workers.yaml", "batch", "Job", "sparta-workers", w),
    ]
    kust = [
        "# Written by deploy/k8s/generate.py (do not edit: write it again):\n",
        f"#   deploy/k8s/generate.py --ps {ps} --workers {workers} --replicas {replicas}"
        f" --out {os.path.relpath(os.path.abspath(out), os.path.join(BASE, '../../..'))}\n",
        f"# The base with {counts}.\n",
        "apiVersion: kustomize.config.k8s.io/v1beta1\n",
        "kind: Kustomization\n",
        "resources:\n",
        f"  - {base}\n",
        "patches:\n",
    ]
    for file, group, kind, name, _ in patches:
        kust.append(
            f"  - path: {file}\n    target:\n      group: {group}\n      version: v1\n"
            f"      kind: {kind}\n      name: {name}\n"
        )
    files = {"kustomization.yaml": "".join(kust)}
    for file, _, _, _, patch in patches:
        files[file] = patch.text()
    return files


def check(out):
    """Exit status 0 when `out` holds what its recorded command writes."""
    path = os.path.join(out, "kustomization.yaml")
    with open(path, encoding="utf-8") as f:
        m = COMMAND_LINE.search(f.read())
    if not m:
        print(f"{path}: no generate.py command line in its header", file=sys.stderr)
        return 1
    a = parser().parse_args(m.group(1).split())
    want = overlay(a.ps, a.workers, a.replicas, out)
    have = {n: open(os.path.join(out, n), encoding="utf-8").read() for n in os.listdir(out)}
    bad = 0
    for name in sorted(set(want) | set(have)):
        w, h = want.get(name, ""), have.get(name, "")
        if w != h:
            bad += 1
            sys.stderr.writelines(
                difflib.unified_diff(
                    h.splitlines(True), w.splitlines(True), f"{out}/{name} (committed)",
                    f"{out}/{name} (generate.py {m.group(1)})",
                )
            )
    if bad:
        print(f"{out}: {bad} file(s) differ from what generate.py writes: write it again", file=sys.stderr)
        return 1
    print(f"{out}: what `generate.py {m.group(1)}` writes")
    return 0


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ps", type=int, required=True, help="PS shards (processes)")
    p.add_argument("--workers", type=int, required=True, help="training workers")
    p.add_argument("--replicas", type=int, required=True, help="copies of every shard")
    p.add_argument("--out", required=True, help="the overlay's directory (written)")
    return p


def main():
    if sys.argv[1:2] == ["--check"]:
        if len(sys.argv) != 3:
            raise SystemExit("usage: generate.py --check OVERLAY_DIR")
        return check(sys.argv[2])
    a = parser().parse_args()
    files = overlay(a.ps, a.workers, a.replicas, a.out)
    os.makedirs(a.out, exist_ok=True)
    for name in os.listdir(a.out):
        if name.endswith(".yaml") and name not in files:
            os.remove(os.path.join(a.out, name))
    for name, text in files.items():
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            f.write(text)
    print(f"wrote {', '.join(sorted(files))} to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

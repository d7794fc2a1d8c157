#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests (`kubectl kustomize` output) of a Sparta job:

1. every container's command line is accepted by the real binary: `sparta --dry-run` with
   the container's command and args (`$(VAR)` expanded from its env as the kubelet does, the
   completion index 0; `/bin/sh -c "... sparta ..."` run by sh with `sparta` standing for
   `SPARTA_BIN --dry-run`), the ConfigMaps it mounts written to a temporary directory and
   their mount paths pointed there, so the job config is read and validated too;
2. the counts agree everywhere: the PS Job's completions, --num-shards and --peers (the
   pods' DNS names, in shard order), the workers Job's completions, --num-workers and the
   PS's --workers, every --ps list, --replicas, the disruption budget; the PS memory limit
   covers --replicas x --memory-limit plus 4 GiB;
3. every container has CPU and memory requests and limits, and readiness and liveness
   probes.

  scripts/check-k8s.py SPARTA_BIN RENDERED.yaml
Exit 1 naming every problem. Needs PyYAML.
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile

import yaml

INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
HEADROOM = 4 << 30
WORKLOADS = ("Job", "Deployment", "StatefulSet", "DaemonSet")
problems = []


def problem(msg):
    problems.append(msg)
    print(f"FAIL {msg}", file=sys.stderr)


def expand(text, env):
    """The kubelet's `$(VAR)` expansion (`$$` is a literal `$`; an unknown name stays)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def container_env(doc, c):
    """The container's environment as the kubelet gives it to index 0 of a Job."""
    name = doc["metadata"]["name"]
    env = {"HOSTNAME": f"{name}-0", "JOB_COMPLETION_INDEX": "0"}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == INDEX_FIELD:
            env[e["name"]] = "0"
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = f"{name}-0"
    return env


def flags(argv):
    """`--flag=value` / `--flag value` / `--flag` of a command line: {flag: value or True}."""
    out = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[a] = argv[i + 1]
                i += 1
            else:
                out[a] = True
        i += 1
    return out


def sparta_argv(argv):
    """The `sparta ...` words of a container's command line (inside `sh -c` too)."""
    if len(argv) >= 3 and os.path.basename(argv[0]) in ("sh", "bash") and argv[1] == "-c":
        words = shlex.split(argv[2])
        while words and words[0] in ("exec",):
            words = words[1:]
        return words
    return argv


def bytes_of(size):
    """`6GiB` (sparta) or `16Gi` (Kubernetes) in bytes."""
    m = re.fullmatch(r"(\d+)\s*([KMGT]i?)?B?", str(size))
    if not m:
        raise ValueError(f"unreadable size {size!r}")
    unit = m.group(2) or ""
    power = " KMGT".index(unit[0]) if unit else 0
    return int(m.group(1)) * (1024 if unit.endswith("i") else 1000) ** power


def dry_run(binary, doc, c, maps, tmp):
    """Runs the container's command line with `--dry-run`; returns its sparta words."""
    where = f"{doc['kind']}/{doc['metadata']['name']} container {c['name']}"
    env = container_env(doc, c)
    argv = [expand(str(a), env) for a in c.get("command", []) + c.get("args", [])]
    # The ConfigMaps it mounts, written out; their mount paths pointed there.
    volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"].get("volumes", [])}
    moved = []
    for m in c.get("volumeMounts", []):
        cm = volumes.get(m["name"], {}).get("configMap")
        if cm is None:
            continue
        if cm["name"] not in maps:
            problem(f"{where}: mounts ConfigMap {cm['name']}, which is not in the manifests")
            continue
        d = os.path.join(tmp, cm["name"])
        os.makedirs(d, exist_ok=True)
        for k, v in maps[cm["name"]].items():
            with open(os.path.join(d, k), "w", encoding="utf-8") as f:
                f.write(v)
        moved.append((m["mountPath"].rstrip("/") + "/", d + "/"))
    for old, new in moved:
        argv = [a.replace(old, new) for a in argv]
    words = sparta_argv(argv)
    if not words or os.path.basename(words[0]) != "sparta":
        problem(f"{where}: runs {argv!r}, not sparta")
        return []
    wrap = os.path.join(tmp, "bin")
    os.makedirs(wrap, exist_ok=True)
    with open(os.path.join(wrap, "sparta"), "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\nexec {shlex.quote(binary)} --dry-run "$@"\n')
    os.chmod(os.path.join(wrap, "sparta"), 0o755)
    run_env = dict(os.environ, **env, PATH=f"{wrap}:{os.environ['PATH']}", RUST_LOG="warn")
    if argv is words:
        cmd = [os.path.join(wrap, "sparta")] + words[1:]
    else:
        cmd = argv
    r = subprocess.run(cmd, env=run_env, capture_output=True, text=True)
    if r.returncode != 0:
        problem(f"{where}: `sparta --dry-run` refused {shlex.join(words)}:\n{r.stderr.strip()}")
        return words
    config = flags(words).get("--config")
    if config and f"config {config}: valid" not in r.stdout:
        problem(f"{where}: its job config {config} was not read:\n{r.stdout.strip()}")
    print(f"ok   {where}: " + "; ".join(r.stdout.splitlines()[:2]))
    return words


def require(cond, msg):
    if not cond:
        problem(msg)


def check_resources(doc, c):
    where = f"{doc['kind']}/{doc['metadata']['name']} container {c['name']}"
    res = c.get("resources", {})
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            require(r in res.get(kind, {}), f"{where}: no {r} in resources.{kind}")
    for probe in ("readinessProbe", "livenessProbe"):
        require(probe in c, f"{where}: no {probe}")


def main():
    binary, rendered = sys.argv[1], sys.argv[2]
    with open(rendered, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    cmd = {}  # sparta subcommand -> (workload, container, flags)
    with tempfile.TemporaryDirectory() as tmp:
        for d in docs:
            if d["kind"] not in WORKLOADS:
                continue
            for c in d["spec"]["template"]["spec"]["containers"]:
                check_resources(d, c)
                words = dry_run(binary, d, c, maps, tmp)
                if len(words) > 1:
                    cmd[words[1]] = (d, c, flags(words[2:]))
    for need in ("ps", "worker"):
        require(need in cmd, f"no container runs `sparta {need}`")
    if problems:
        return 1
    ps_job, ps_c, ps = cmd["ps"]
    w_job, _, w = cmd["worker"]
    shards = int(ps["--num-shards"])
    replicas = int(ps.get("--replicas", 1))
    peers = ps.get("--peers", "").split(",") if "--peers" in ps else []
    require(ps_job["kind"] == "Job", "the PS shards are not a Job: their pods would not end with it")
    require(ps_job["spec"].get("completionMode") == "Indexed", "the PS Job is not Indexed")
    require(ps_job["spec"]["completions"] == shards, f"PS Job completions {ps_job['spec']['completions']} != --num-shards {shards}")
    require(ps_job["spec"].get("parallelism") == shards, "PS Job parallelism != --num-shards")
    require("--exit-when-done" in ps, "the PS runs without --exit-when-done: its pods would not end")
    # Pod I of an Indexed Job is named JOB-I; with the headless Service as its subdomain it
    # resolves as JOB-I.SUBDOMAIN.
    sub = ps_job["spec"]["template"]["spec"].get("subdomain")
    svc = services.get(sub, {})
    require(svc.get("spec", {}).get("clusterIP") == "None", f"the PS pods' subdomain {sub!r} is no headless Service")
    port = ps.get("--listen", "0.0.0.0:7070").rsplit(":", 1)[1]
    want = [f"{ps_job['metadata']['name']}-{i}.{sub}:{port}" for i in range(shards)]
    if replicas > 1:
        require(peers == want, f"PS --peers {peers} != the pods' addresses {want}")
    require(w["--ps"].split(",") == want, f"worker --ps {w['--ps']} != the PS pods' addresses {want}")
    workers = int(w["--num-workers"])
    require(int(ps.get("--workers", 1)) == workers, f"PS --workers {ps.get('--workers')} != --num-workers {workers}")
    require(w_job["spec"]["completions"] == workers, "workers Job completions != --num-workers")
    require(w_job["spec"].get("parallelism") == workers, "workers Job parallelism != --num-workers")
    if "coordinator" in cmd:
        _, _, co = cmd["coordinator"]
        require(co["--ps"].split(",") == want, f"coordinator --ps {co['--ps']} != {want}")
        require(int(co["--replicas"]) == replicas, "coordinator --replicas != PS --replicas")
    elif replicas > 1:
        problem("--replicas above 1 and no coordinator: nothing fails the shards over")
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    require(len(budgets) == 1, f"{len(budgets)} PodDisruptionBudgets, want one for the PS pods")
    for b in budgets:
        want_min = shards - 1 if replicas > 1 else shards
        require(b["spec"].get("minAvailable") == want_min, f"PS budget minAvailable {b['spec'].get('minAvailable')} != {want_min}")
    if "--memory-limit" in ps:
        cap = bytes_of(ps["--memory-limit"])
        limit = bytes_of(ps_c["resources"]["limits"]["memory"])
        require(replicas * cap + HEADROOM <= limit, f"PS memory limit {ps_c['resources']['limits']['memory']} < --replicas {replicas} x --memory-limit {ps['--memory-limit']} + 4 GiB")
    else:
        problem("the PS runs without --memory-limit: its memory limit would kill it instead of evicting rows")
    if problems:
        return 1
    print(f"ok   counts: {shards} shard(s), {workers} worker(s), {replicas} copies; PS memory {ps_c['resources']['limits']['memory']} >= {replicas} x {ps['--memory-limit']} + 4 GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

//! `sparta forget` (right to erasure) and removals on a PS cluster, with real processes on
//! loopback: 2 hand-started `sparta ps` (with `--replicas 2`: each shard's backup on the other
//! process, and a coordinator) and one `sparta worker --follow` that checkpoints and exports
//! every 4 steps, served by `sparta serve`. Forgotten values leave the shards (primaries and
//! backups), the next checkpoint (a rollback restore of the chain does not bring them back) and
//! the next delta export (the served model's rows equal the shards'); with eviction, the served
//! rows equal the shards' after every export. Offline, `--checkpoint-dir` / `--export-dir`
//! rewrite an embedded job's or a stopped cluster job's checkpoint and export, so a resume and
//! the served model no longer have them.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::http::model;
use common::{cmd, gen, ok, s, start_ps, Proc};
use sparta_proto::pb::{ChecksumRequest, InfoRequest};

const TOKEN: &str = "tok";
/// Longest wait for a condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(120);
/// Rows per shipped file: 8 batches of 128, two checkpoint (and export) rounds.
const ROWS: u64 = 1024;

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, LIMIT, f)
}

/// One copy of a shard: (shard, primary, (rows, sum) of every table).
type ShardCopy = (u32, bool, Vec<(u64, u64)>);
/// An export version: (version, step, rows removed per table name over its parts).
type Export = (u64, u64, Vec<(String, u64)>);

/// A cluster job: its config and directories.
struct Job {
    config: PathBuf,
    input: PathBuf,
    ckpt: PathBuf,
    export: PathBuf,
    stop: PathBuf,
}

impl Job {
    /// wdl (every id in `embedding` and `wide`), batches of 128, a checkpoint and an export
    /// every 4 steps, incremental checkpoints after the first; `extra` appended to the TOML.
    fn new(d: &Path, extra: &str) -> Job {
        let input = d.join("in");
        std::fs::create_dir(&input).unwrap();
        let (ckpt, export) = (d.join("ckpt"), d.join("export"));
        let config = d.join("job.toml");
        std::fs::write(
            &config,
            format!(
                "[model]\nkind = \"wdl\"\nhidden = [16]\n[data]\nbatch_size = 128\n\
                 reader_threads = 1\n[train]\nthreads = 1\nseed = 7\ncheckpoint_dir = {:?}\n\
                 checkpoint_every_steps = 4\ncheckpoint_full_every = 100\n[export]\n\
                 dir = {:?}\nkeep_full = 100\n{extra}",
                s(&ckpt),
                s(&export)
            ),
        )
        .unwrap();
        Job {
            config,
            input,
            ckpt,
            export,
            stop: d.join("STOP"),
        }
    }

    /// Puts a copy of `file` into the followed directory as a shipper does (a dotfile
    /// renamed when complete).
    fn ship(&self, file: &Path, name: &str) {
        let tmp = self.input.join(format!(".{name}"));
        std::fs::copy(file, &tmp).unwrap();
        std::fs::rename(tmp, self.input.join(name)).unwrap();
    }
}

/// 2 PS processes (each shard's backup on the other with `replicas` 2) and one following
/// worker.
struct Cluster {
    addrs: Vec<String>,
    _ps: Vec<Proc>,
    worker: Option<Proc>,
}

impl Cluster {
    fn start(job: &Job, replicas: usize) -> Cluster {
        let mut cluster = Cluster::shards(job, replicas, &[]);
        let peers = cluster.addrs.join(",");
        let mut c = cmd(&[
            "worker",
            "--rank",
            "0",
            "--num-workers",
            "1",
            "--ps",
            &peers,
        ]);
        c.args(["--config", s(&job.config), "--follow", s(&job.input)])
            .args(["--stop-file", s(&job.stop), "--quiet"])
            .args(["--follow-poll-secs", "0.05", "--follow-settle-secs", "0"])
            .env("SPARTA_TOKEN", TOKEN);
        cluster.worker = Some(Proc::start(c));
        cluster
    }

    /// The 2 PS processes alone, with `extra` flags.
    fn shards(job: &Job, replicas: usize, extra: &[&str]) -> Cluster {
        let addrs = common::free_ports(2);
        let peers = addrs.join(",");
        let ps = (0..2)
            .map(|i| {
                let shard = i.to_string();
                let mut args = vec!["--shard", &shard, "--num-shards", "2", "--workers", "1"];
                args.extend(["--config", s(&job.config), "--listen", &addrs[i]]);
                if replicas > 1 {
                    args.extend(["--replicas", "2", "--peers", &peers]);
                }
                args.extend(extra);
                start_ps(&args, Some(TOKEN)).0
            })
            .collect();
        Cluster {
            addrs,
            _ps: ps,
            worker: None,
        }
    }

    /// Rows per physical table (by name), summed over the shards' primaries (`Info`).
    fn rows(&self) -> Vec<(String, u64)> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut out: Vec<(String, u64)> = Vec::new();
        for addr in &self.addrs {
            let info = rt.block_on(async {
                let mut c = sparta_ps::replica::peer_client(addr, TOKEN, 64 << 20, None).unwrap();
                c.info(InfoRequest {}).await.unwrap().into_inner()
            });
            for t in info.tables {
                let n: u64 = t.tag_rows.iter().sum();
                match out.iter_mut().find(|(name, _)| *name == t.name) {
                    Some(e) => e.1 += n,
                    None => out.push((t.name.clone(), n)),
                }
            }
        }
        out
    }

    /// Per shard, the (rows, sum) of every table of each copy: `[(shard, primary, tables)]`.
    fn checksums(&self) -> Vec<ShardCopy> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut out = Vec::new();
        for addr in &self.addrs {
            let _g = rt.enter();
            let mut c = sparta_ps::replica::peer_client(addr, TOKEN, 64 << 20, None).unwrap();
            for shard in 0..self.addrs.len() as u32 {
                if let Ok(r) = rt.block_on(c.checksum(ChecksumRequest { shard })) {
                    let r = r.into_inner();
                    let t = r.tables.iter().map(|t| (t.rows, t.sum)).collect();
                    out.push((shard, r.primary, t));
                }
            }
        }
        out
    }

    /// Stops the worker with the stop file (the end-of-job checkpoint is written).
    fn stop(self, job: &Job) -> Vec<Proc> {
        std::fs::write(&job.stop, b"").unwrap();
        let (done, log) = self.worker.expect("a worker").wait(LIMIT);
        assert!(done, "{log}");
        self._ps
    }
}

/// (version, step, removed per table name summed over parts) of every complete export.
fn exports(dir: &Path) -> Vec<Export> {
    common::export_manifests(dir)
        .into_iter()
        .map(|m| {
            let mut removed: Vec<(String, u64)> = Vec::new();
            for t in m["tables"].as_array().unwrap() {
                let (name, n) = (t["name"].as_str().unwrap(), t["removed"].as_u64().unwrap());
                match removed.iter_mut().find(|(x, _)| x == name) {
                    Some(e) => e.1 += n,
                    None => removed.push((name.to_string(), n)),
                }
            }
            (
                m["version"].as_u64().unwrap(),
                m["step"].as_u64().unwrap(),
                removed,
            )
        })
        .collect()
}

/// Waits for an export of step `step`; returns its version.
fn exported(job: &Job, step: u64) -> u64 {
    wait_for(&format!("an export of step {step}"), || {
        exports(&job.export)
            .iter()
            .find(|e| e.1 == step)
            .map(|e| e.0)
    })
}

/// Rows per physical table of the model `sparta serve` at `addr` serves, once it serves
/// `version`.
fn served_rows(addr: std::net::SocketAddr, version: u64) -> Vec<(String, u64)> {
    let m = wait_for(&format!("the server to load version {version}"), || {
        model(addr).filter(|m| m["version"].as_u64() == Some(version))
    });
    let mut rows: Vec<(String, u64)> = m["rows"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    rows.sort();
    rows
}

fn sorted(mut v: Vec<(String, u64)>) -> Vec<(String, u64)> {
    v.sort();
    v
}

/// The categorical fields (`C1`..`C26`: columns 14.. of a generated line) of a file.
fn fields(p: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').skip(14).map(str::to_string).collect())
        .collect()
}

/// Values of `trained` to forget that `later` never holds (in any column, so training on
/// `later` does not bring them back): `C<c>\tvalue` lines of three columns, and one bare
/// value. Returns the ids file's text and the (column, value) pairs trained that it names.
fn pick_values(trained: &Path, later: &Path) -> (String, BTreeSet<(usize, String)>) {
    let seen_later: BTreeSet<String> = fields(later).into_iter().flatten().collect();
    let rows = fields(trained);
    let fresh = |v: &String| !v.is_empty() && !seen_later.contains(v);
    let mut lines = Vec::new();
    let mut named = BTreeSet::new();
    for col in [2usize, 3, 9] {
        let v = rows
            .iter()
            .map(|r| &r[col])
            .find(|v| fresh(v))
            .unwrap_or_else(|| panic!("no value of C{} only in the first file", col + 1))
            .clone();
        lines.push(format!("C{}\t{v}", col + 1));
        named.insert((col, v));
    }
    let bare = rows
        .iter()
        .flat_map(|r| r.iter().enumerate().skip(12))
        .find(|(_, v)| fresh(v))
        .map(|(_, v)| v.clone())
        .expect("a value only in the first file");
    lines.push(bare.clone());
    // A bare value names every column: those where it was trained.
    for r in &rows {
        for (c, v) in r.iter().enumerate() {
            if *v == bare {
                named.insert((c, bare.clone()));
            }
        }
    }
    (lines.join("\n") + "\n", named)
}

/// The keys training gives `named` (column `c` = slot `c`, tag `c`).
fn keys(named: &BTreeSet<(usize, String)>) -> Vec<u64> {
    named
        .iter()
        .map(|(c, v)| sparta_data::feature_id(*c as u8, v.as_bytes()))
        .collect()
}

/// `sparta forget --ps ... --json` (through the coordinator at `coordinator` when given): the
/// rows removed per table and in all.
fn forget_on(
    addrs: &[String],
    coordinator: Option<&str>,
    config: &Path,
    ids: &Path,
) -> (Vec<(String, u64)>, u64) {
    let o = cmd(&["forget", "--ps", &addrs.join(",")])
        .args(
            coordinator
                .map(|c| ["--coordinator", c])
                .into_iter()
                .flatten(),
        )
        .args(["--config", s(config), "--ids", s(ids), "--json"])
        .env("SPARTA_TOKEN", TOKEN)
        .output()
        .unwrap();
    ok(&o, "sparta forget --ps");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let removed = j["removed"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    (sorted(removed), j["removed_total"].as_u64().unwrap())
}

/// Restores the newest checkpoint chain of `dir` (every part, as a rollback restores it):
/// rows per table, the chain's length and its step, and how many of the (table, key)
/// pairs of `keys` it holds.
fn restore(dir: &Path, keys: &[u64]) -> (Vec<(String, u64)>, usize, u64, usize) {
    let storage = sparta_checkpoint::LocalDir::new(dir).unwrap();
    let r =
        sparta_checkpoint::restore_latest(&storage, |_, cfg| sparta_table::Table::new(cfg.clone()))
            .unwrap()
            .expect("a checkpoint");
    let mut rows: Vec<(String, u64)> = Vec::new();
    let mut held = 0;
    for t in &r.tables {
        held += keys.iter().filter(|&&k| t.table.contains(k)).count();
        match rows.iter_mut().find(|(n, _)| *n == t.name) {
            Some(e) => e.1 += t.table.len() as u64,
            None => rows.push((t.name.clone(), t.table.len() as u64)),
        }
    }
    (sorted(rows), r.chain.len(), r.step, held)
}

fn forget_on_a_cluster(replicas: usize) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = Job::new(d, "");
    let first = gen(d, "first.tsv", ROWS, 1);
    let later = gen(d, "later.tsv", ROWS, 2);
    job.ship(&first, "2026-12-01T00.tsv");
    let (text, named) = pick_values(&first, &later);
    let ids = d.join("ids.tsv");
    std::fs::write(&ids, text).unwrap();
    let forgotten = keys(&named);

    let cluster = Cluster::start(&job, replicas);
    let v = exported(&job, 8);
    let (server, addr) = common::serve(&job.export, 50, LIMIT);
    let before = sorted(cluster.rows());
    assert_eq!(served_rows(addr, v), before, "served before the forget");

    // Every named (column, value) was trained: a row in `embedding` and one in `wide` each.
    // Replicated: through a coordinator, as the workers of such a cluster reach the primaries.
    let coordinator = (replicas > 1).then(|| {
        let addr = common::free_ports(1).remove(0);
        let mut c = cmd(&[
            "coordinator",
            "--ps",
            &cluster.addrs.join(","),
            "--replicas",
            "2",
        ]);
        c.args(["--listen", &addr]).env("SPARTA_TOKEN", TOKEN);
        let mut p = Proc::start(c);
        p.wait_line(LIMIT, |l| l.contains("coordinator listening").then_some(()));
        (p, addr)
    });
    let via = coordinator.as_ref().map(|(_, a)| a.as_str());
    let (removed, total) = forget_on(&cluster.addrs, via, &job.config, &ids);
    let per_table = named.len() as u64;
    assert!(per_table > 0);
    assert_eq!(
        removed,
        vec![("embedding".into(), per_table), ("wide".into(), per_table)],
        "{named:?}"
    );
    assert_eq!(total, 2 * per_table);
    // The shards no longer hold them.
    let after = sorted(cluster.rows());
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        assert_eq!(b - a, per_table, "rows of {name}: {before:?} -> {after:?}");
    }
    if replicas > 1 {
        let sums = cluster.checksums();
        for shard in 0..2 {
            let copies: Vec<_> = sums.iter().filter(|c| c.0 == shard).collect();
            assert_eq!(copies.len(), 2, "{sums:?}");
            assert_eq!(copies[0].2, copies[1].2, "shard {shard}: {sums:?}");
        }
    }
    // Forgetting again removes nothing.
    let (_, again) = forget_on(&cluster.addrs, via, &job.config, &ids);
    assert_eq!(again, 0);

    // The next rounds (steps 12 and 16) train on a file without the values: the first delta
    // export after the forget carries exactly the removals, and the served model drops them.
    job.ship(&later, "2026-12-01T01.tsv");
    let last = exported(&job, 16);
    let now = sorted(cluster.rows());
    assert_eq!(served_rows(addr, last), now, "served after the forget");
    let es = exports(&job.export);
    let carried: Vec<_> = es.iter().filter(|e| e.1 > 8).collect();
    assert_eq!(
        sorted(carried[0].2.clone()),
        removed,
        "the first export after the forget: {es:?}"
    );
    assert!(
        carried[1..]
            .iter()
            .all(|e| e.2.iter().all(|(_, n)| *n == 0)),
        "{es:?}"
    );

    // The end-of-job checkpoint, restored as a rollback would (full at step 4, then the
    // incrementals), has none of them, and the shards' rows.
    let ps = cluster.stop(&job);
    let (rows, chain, _, held) = restore(&job.ckpt, &forgotten);
    assert_eq!(
        held, 0,
        "forgotten keys came back in the restored checkpoint"
    );
    assert!(chain > 1, "an incremental chain: {chain}");
    assert_eq!(rows, now);
    drop(ps);
    drop(server);
}

/// Offline on a stopped cluster job: `sparta forget --checkpoint-dir --export-dir` rewrites
/// every shard's part of the checkpoint and of the export; PS shards resumed from the
/// checkpoint (as `sparta launch --resume` starts them) and the served export hold none of the
/// values.
#[test]
fn forget_in_a_stopped_cluster_jobs_checkpoint_and_export_reaches_every_shards_part() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = Job::new(d, "");
    let (first, later) = (gen(d, "first.tsv", ROWS, 1), gen(d, "later.tsv", ROWS, 2));
    let (text, named) = pick_values(&first, &later);
    let ids = d.join("ids.tsv");
    std::fs::write(&ids, text).unwrap();
    let forgotten = keys(&named);
    let n = named.len() as u64;
    job.ship(&first, "2026-12-01T00.tsv");
    let cluster = Cluster::start(&job, 1);
    exported(&job, 8);
    drop(cluster.stop(&job));
    let (before, chain, step, held) = restore(&job.ckpt, &forgotten);
    assert_eq!(held as u64, 2 * n);
    let v = exports(&job.export).last().unwrap().0;
    let o = cmd(&[
        "forget",
        "--checkpoint-dir",
        s(&job.ckpt),
        "--ids",
        s(&ids),
        "--json",
    ])
    .args(["--export-dir", s(&job.export)])
    .output()
    .unwrap();
    ok(
        &o,
        "sparta forget --checkpoint-dir --export-dir of a cluster job",
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let want = serde_json::json!({"embedding": n, "wide": n});
    assert_eq!(j["checkpoint"]["removed"], want, "{j}");
    assert_eq!(j["export"]["removed"], want, "{j}");
    // The export's next version: a delta in parts, on the served chain.
    let snap = sparta_serve::Snapshot::load_latest(&job.export).unwrap();
    assert_eq!(snap.version(), v + 1);
    for t in ["embedding", "wide"] {
        let rows = snap.tables().by_name(t).unwrap();
        assert!(forgotten.iter().all(|&k| rows.get(k).is_none()), "{t}");
    }
    assert_eq!(j["checkpoint"]["kind"], "incremental", "{j}");
    let less: Vec<(String, u64)> = before.iter().map(|(t, r)| (t.clone(), r - n)).collect();
    let (rows, after_chain, after_step, held) = restore(&job.ckpt, &forgotten);
    assert_eq!((held, after_chain, after_step), (0, chain + 1, step));
    assert_eq!(rows, less);
    let served: Vec<(String, u64)> = ["embedding", "wide"]
        .iter()
        .map(|t| {
            (
                t.to_string(),
                snap.tables().by_name(t).unwrap().len() as u64,
            )
        })
        .collect();
    assert_eq!(served, less);
    // Each shard resumes its own part of the rewritten checkpoint.
    let resumed = Cluster::shards(&job, 1, &["--resume", s(&job.ckpt)]);
    assert_eq!(sorted(resumed.rows()), less);
}

/// Test (f): forgotten values leave the shards, the next checkpoint and the next delta export.
#[test]
fn forget_removes_values_from_shards_checkpoints_and_the_served_export() {
    forget_on_a_cluster(1);
}

/// Test (f) with `--replicas 2` (and `sparta forget --coordinator`, following its routes to
/// the primaries): the backups equal their primaries after the forget.
#[test]
fn forget_on_replicated_shards_reaches_the_backups() {
    forget_on_a_cluster(2);
}

/// Test (d): with eviction configured, after each export the served model's rows per table
/// equal the shards' rows (summed over the shards): evicted rows reach the delta exports.
#[test]
fn served_rows_equal_the_shards_rows_after_each_export_with_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = Job::new(d, "[embedding]\neviction = { max_idle_steps = 2 }\n");
    let (first, later) = (gen(d, "first.tsv", ROWS, 1), gen(d, "later.tsv", ROWS, 2));
    job.ship(&first, "2026-12-01T00.tsv");
    let cluster = Cluster::start(&job, 1);
    let v = exported(&job, 8);
    let (server, addr) = common::serve(&job.export, 50, LIMIT);
    assert_eq!(
        served_rows(addr, v),
        sorted(cluster.rows()),
        "export at step 8"
    );
    job.ship(&later, "2026-12-01T01.tsv");
    let v = exported(&job, 16);
    assert_eq!(
        served_rows(addr, v),
        sorted(cluster.rows()),
        "export at step 16"
    );
    let es = exports(&job.export);
    // Not vacuous: the shards evicted, and the deltas carried the removals.
    assert!(
        es[1..].iter().any(|e| e.2.iter().any(|(_, n)| *n > 0)),
        "no delta export removed a row: {es:?}"
    );
    let ps = cluster.stop(&job);
    drop(ps);
    drop(server);
}

/// `sparta train` (wdl, batches of 128, a checkpoint every 4 steps, exports) on `train`, with
/// `extra` flags.
fn train(train: &[&Path], ckpt: &Path, export: &Path, extra: &[&str]) {
    let o = cmd(&["train", "--train"])
        .args(train.iter().map(|p| s(p)))
        .args(["--model", "wdl", "--batch-size", "128"])
        .args([
            "--threads",
            "1",
            "--reader-threads",
            "1",
            "--epochs",
            "1",
            "--seed",
            "7",
        ])
        .args(["--checkpoint-dir", s(ckpt), "--checkpoint-every-steps", "4"])
        .args(["--export-dir", s(export), "--quiet"])
        .args(extra)
        .output()
        .unwrap();
    ok(&o, "sparta train");
}

/// Embedded: `sparta forget --checkpoint-dir --export-dir` writes the next checkpoint and the
/// next export version without the values; `sparta train --resume` then has none of them.
#[test]
fn forget_in_a_checkpoint_and_an_export_then_a_resume_has_none_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (first, later) = (gen(d, "first.tsv", ROWS, 1), gen(d, "later.tsv", ROWS, 2));
    let (text, named) = pick_values(&first, &later);
    let ids = d.join("ids.tsv");
    std::fs::write(&ids, text).unwrap();
    let forgotten = keys(&named);
    let n = named.len() as u64;
    let (ckpt, export) = (d.join("ckpt"), d.join("export"));
    train(&[&first], &ckpt, &export, &[]);
    let (before, chain, step, held) = restore(&ckpt, &forgotten);
    // Each named value has a row in `embedding` and one in `wide`.
    assert_eq!(held as u64, 2 * n);
    let (server, addr) = common::serve(&export, 50, LIMIT);
    let v = exports(&export).last().unwrap().0;
    assert_eq!(served_rows(addr, v), before);

    let o = cmd(&[
        "forget",
        "--checkpoint-dir",
        s(&ckpt),
        "--export-dir",
        s(&export),
    ])
    .args(["--ids", s(&ids), "--json"])
    .output()
    .unwrap();
    ok(&o, "sparta forget --checkpoint-dir --export-dir");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let want = serde_json::json!({"embedding": n, "wide": n});
    assert_eq!(j["checkpoint"]["removed"], want, "{j}");
    assert_eq!(j["export"]["removed"], want, "{j}");
    let less: Vec<(String, u64)> = before.iter().map(|(t, r)| (t.clone(), r - n)).collect();
    // The next checkpoint of the chain, at the same step, without them.
    let (rows, after_chain, after_step, held) = restore(&ckpt, &forgotten);
    assert_eq!((held, after_chain, after_step), (0, chain + 1, step), "{j}");
    assert_eq!(rows, less);
    // The next export version (a delta) drops them from the served model.
    assert_eq!(served_rows(addr, v + 1), less);
    let snap = sparta_serve::Snapshot::load_latest(&export).unwrap();
    for t in ["embedding", "wide"] {
        let rows = snap.tables().by_name(t).unwrap();
        assert!(forgotten.iter().all(|&k| rows.get(k).is_none()), "{t}");
    }
    // Forgetting again writes nothing.
    let o = cmd(&[
        "forget",
        "--checkpoint-dir",
        s(&ckpt),
        "--export-dir",
        s(&export),
    ])
    .args(["--ids", s(&ids)])
    .output()
    .unwrap();
    ok(&o, "sparta forget, again");
    assert_eq!(restore(&ckpt, &forgotten).1, chain + 1);
    assert_eq!(exports(&export).last().unwrap().0, v + 1);

    // A resume continues from the rewritten checkpoint, after the first file: on a file
    // without the values.
    train(&[&first, &later], &ckpt, &export, &["--resume", s(&ckpt)]);
    let (_, _, resumed_step, held) = restore(&ckpt, &forgotten);
    assert!(resumed_step > step);
    assert_eq!(held, 0, "a resume brought forgotten keys back");
    drop(server);
}

/// Errors name the line of the ids file, and the shard address that did not answer.
#[test]
fn errors_name_the_line_of_the_ids_file_and_the_shard_address() {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.tsv");
    std::fs::write(&ids, "C3\t68fd1e64\n\nC99\tabc\n").unwrap();
    let addr = common::free_ports(1).remove(0);
    let o = cmd(&["forget", "--ps", &addr, "--ids", s(&ids)])
        .env("SPARTA_TOKEN", TOKEN)
        .output()
        .unwrap();
    let e = common::stderr(&o);
    assert!(!o.status.success());
    assert!(
        e.contains(&format!("{} line 3", ids.display())) && e.contains("unknown feature \"C99\""),
        "{e}"
    );
    std::fs::write(&ids, "C3\t68fd1e64\n").unwrap();
    let o = cmd(&["forget", "--ps", &addr, "--ids", s(&ids)])
        .env("SPARTA_TOKEN", TOKEN)
        .output()
        .unwrap();
    let e = common::stderr(&o);
    assert!(!o.status.success());
    assert!(e.contains(&format!("PS at {addr}")), "{e}");
}

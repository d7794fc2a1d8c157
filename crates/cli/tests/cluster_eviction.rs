//! Bounded tables on PS shards (issue 36): real processes on loopback over a stream of files
//! whose ids churn (most ids of a row appear in that row only). With `eviction = {
//! max_idle_steps }` a `launch --ps 2 --workers 2` cluster keeps as many rows as the embedded
//! trainer on the same files; backups evict with their primaries; a shard with a memory cap
//! stays under it and counts its evictions.

mod common;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cmd, json, s, start_ps, Proc};

const TOKEN: &str = "tok";
/// Longest wait for a process or condition (a hang guard, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(240);
/// Columns whose ids recur in every file (a small vocabulary); the other 16 are fresh.
const RECURRING: usize = 10;

/// Writes `rows` Criteo-layout lines (label, 13 integers, 26 categorical hashes) as
/// `dir/name`: the first `RECURRING` columns draw from 20 values, the others are new in every
/// row of every file `file` (so rows go stale as soon as their line is trained).
fn churn_file(dir: &Path, name: &str, file: u64, rows: u64) -> PathBuf {
    let p = dir.join(name);
    let mut w = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
    let mut x = file.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for r in 0..rows {
        let label = next() % 4 == 0;
        let mut line = String::with_capacity(300);
        line.push_str(if label { "1" } else { "0" });
        for _ in 0..13 {
            line.push_str(&format!("\t{}", next() % 50));
        }
        for c in 0..26u64 {
            let v = if (c as usize) < RECURRING {
                next() % 20
            } else {
                ((file * rows + r) << 5) | c
            };
            line.push_str(&format!("\t{:08x}", sparta_table::mix64(v + 1) as u32));
        }
        line.push('\n');
        w.write_all(line.as_bytes()).unwrap();
    }
    w.flush().unwrap();
    p
}

/// `n` churning files of `rows` rows in `dir`.
fn churn_files(dir: &Path, n: u64, rows: u64) -> Vec<PathBuf> {
    (0..n)
        .map(|f| churn_file(dir, &format!("part-{f:03}.tsv"), f, rows))
        .collect()
}

/// A small job (batch 256, one hidden layer) with `extra` appended.
fn job(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "[data]\nbatch_size = 256\nreader_threads = 1\n[model]\nhidden = [16]\n\
             [train]\nthreads = 1\n{extra}"
        ),
    )
    .unwrap();
    p
}

/// Rows of every logical table in a run summary, summed.
fn total_rows(summary: &serde_json::Value) -> u64 {
    summary["tables"]
        .as_object()
        .unwrap_or_else(|| panic!("no tables in {summary}"))
        .values()
        .map(|t| t["rows"].as_u64().unwrap())
        .sum()
}

fn paths(files: &[PathBuf]) -> Vec<&str> {
    files.iter().map(|p| s(p)).collect()
}

/// The numeric value of the `/metrics` line starting with `prefix` (name and labels).
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `/metrics` of a process.
fn scrape(addr: SocketAddr) -> String {
    common::http::http(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .1
}

/// VmRSS of process `pid`, bytes (`None` once it is gone).
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|k| k << 10)
}

#[test]
fn a_cluster_with_eviction_keeps_the_rows_of_the_embedded_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let files = churn_files(d, 8, 2000);
    let config = job(
        d,
        "job.toml",
        "[embedding]\neviction = { max_idle_steps = 8 }\n",
    );
    // Embedded: one trainer over the files in order.
    let embedded = d.join("embedded.json");
    let o = cmd(&["train", "--config", s(&config), "--quiet", "--seed", "7"])
        .arg("--train")
        .args(paths(&files))
        .args(["--summary-json", s(&embedded)])
        .output()
        .unwrap();
    common::ok(&o, "sparta train");
    let rows_embedded = total_rows(&json(&embedded));
    // The cluster: 2 PS, 2 workers over the same files (the shards' clock counts the steps of
    // both workers); every PS gets the memory cap flag (far above what it holds).
    let cluster = d.join("cluster.json");
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
    c.args(["--config", s(&config), "--quiet", "--seed", "7"])
        .args(["--ps-memory-limit", "1GiB"])
        .arg("--train")
        .args(paths(&files))
        .args(["--summary-json", s(&cluster)]);
    let mut launch = Proc::start(c);
    let ps0 = launch.wait_started("ps0", None, LIMIT);
    let cmdline = std::fs::read(format!("/proc/{ps0}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    let (done, log) = launch.wait(LIMIT);
    assert!(done, "{log}");
    assert!(
        cmdline.contains("--memory-limit 1073741824B"),
        "launch passes its cap to the PS: {cmdline}"
    );
    let j = json(&cluster);
    let rows_cluster = total_rows(&j);
    // The summary reports every shard's tables, evictions and PS memory.
    let shards = j["shard_tables"]
        .as_array()
        .unwrap_or_else(|| panic!("{j}"));
    assert_eq!(shards.len(), 2, "{j}");
    for sh in shards {
        assert!(sh["peak_rss_bytes"].as_u64().unwrap() > 0, "{sh}");
        let t = &sh["tables"]["embedding"];
        assert!(
            t["rows"].as_u64().unwrap() > 0 && t["bytes"].as_u64().unwrap() > 0,
            "{sh}"
        );
        assert!(t["evicted"]["idle_steps"].as_u64().unwrap() > 0, "{sh}");
    }
    assert!(j["evicted_rows"].as_u64().unwrap() > 0, "{j}");
    // Every id of the stream: RECURRING columns x 20 values (at most) + 16 fresh per row.
    let fresh = 8 * 2000 * (26 - RECURRING) as u64;
    eprintln!("rows: embedded {rows_embedded}, cluster {rows_cluster}, ids {fresh}+");
    assert!(
        rows_embedded * 4 < fresh,
        "the embedded run evicts: {rows_embedded} rows of {fresh} ids"
    );
    let diff = (rows_cluster as f64 - rows_embedded as f64).abs();
    assert!(
        diff <= 0.1 * rows_embedded as f64,
        "cluster rows {rows_cluster} not within 10 % of the embedded run's {rows_embedded}"
    );
}

#[test]
fn a_shard_over_its_memory_limit_evicts_the_stalest_rows_and_stays_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // ~640k fresh ids (~100 MiB of rows): more than twice the cap.
    let files = churn_files(d, 4, 10_000);
    let config = job(d, "job.toml", "");
    let limit: u64 = 64 << 20;
    let metrics_port = common::free_port();
    let metrics: SocketAddr = format!("127.0.0.1:{metrics_port}").parse().unwrap();
    let (ps, addr) = start_ps(
        &[
            "--shard",
            "0",
            "--num-shards",
            "1",
            "--config",
            s(&config),
            "--memory-limit",
            "64MiB",
            "--metrics-listen",
            &metrics.to_string(),
        ],
        Some(TOKEN),
    );
    // What a PS holds beyond its tables: its RSS while they are empty.
    let empty = common::wait_for("the PS's RSS", LIMIT, || rss(ps.pid()));
    let mut w = cmd(&["worker", "--rank", "0", "--num-workers", "1"]);
    w.args(["--ps", &addr, "--config", s(&config), "--quiet"])
        .args(["--batch-size", "512"])
        .arg("--train")
        .args(paths(&files))
        .env("SPARTA_TOKEN", TOKEN);
    let mut worker = Proc::start(w);
    let (mut peak, mut peak_table) = (0u64, 0f64);
    let table_bytes = |m: &str| {
        m.lines()
            .filter(|l| l.starts_with("sparta_table_bytes{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let status = loop {
        if let Some(st) = worker.child.try_wait().unwrap() {
            break st;
        }
        peak = peak.max(rss(ps.pid()).unwrap_or(0));
        peak_table = peak_table.max(table_bytes(&scrape(metrics)));
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "worker: {}", worker.log());
    let m = scrape(metrics);
    peak = peak.max(rss(ps.pid()).unwrap_or(0));
    peak_table = peak_table.max(table_bytes(&m));
    let evicted: f64 = m
        .lines()
        .filter(|l| l.starts_with("sparta_evicted_rows_total{") && l.contains("memory_limit"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let resident = metric(&m, "sparta_process_resident_bytes").unwrap();
    drop(ps);
    eprintln!(
        "limit {} MiB, empty PS {:.1} MiB, peak RSS {:.1} MiB, peak table bytes {:.1} MiB, \
         evicted {evicted}",
        limit >> 20,
        empty as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        peak_table / 1048576.0
    );
    assert!(
        evicted > 100_000.0,
        "memory_limit evictions counted: {evicted}"
    );
    assert!(resident > 0.0);
    assert!(
        peak_table <= limit as f64,
        "table bytes {peak_table} over the limit {limit}"
    );
    // The documented overhead: the RSS of the PS with empty tables, plus 64 MiB (request
    // buffers, a grown index's or tombstone log's old array until it is purged, allocator
    // slack; measured 30-45 MiB at this batch size).
    let overhead = empty + (64 << 20);
    assert!(
        peak <= limit + overhead,
        "PS RSS {peak} over the limit {limit} + overhead {overhead}"
    );
}

/// Checksums of every copy of every shard.
fn checksums(addrs: &[String]) -> Vec<common::copies::ShardCopy> {
    common::copies::checksums(addrs, TOKEN)
}

/// The ids (keys) of the fresh columns of rows `rows` of churn file `file` of `per` rows.
fn fresh_keys(file: u64, per: u64, rows: std::ops::Range<u64>) -> Vec<u64> {
    let mut keys = Vec::new();
    for r in rows {
        for c in RECURRING as u64..26 {
            let v = ((file * per + r) << 5) | c;
            let text = format!("{:08x}", sparta_table::mix64(v + 1) as u32);
            keys.push(sparta_data::ids::feature_id(c as u8, text.as_bytes()));
        }
    }
    keys
}

/// The coordinator's failovers and (shard, epoch, primary address) of every shard.
fn routes(coord: &str) -> (u64, Vec<(u32, u64, String)>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_cluster::store::route::coordinator_client(coord, TOKEN, None).unwrap();
        let r = c
            .route(sparta_proto::pb::RouteRequest {})
            .await
            .unwrap()
            .into_inner();
        let shards = r.shards.iter().map(|s| (s.shard, s.epoch, s.addr.clone()));
        (r.failovers, shards.collect())
    })
}

/// Embedding rows (dim 16, table 0) of `keys` read without creating any from the copy of
/// `shard` at `epoch` on the PS at `addr`.
fn read_rows(addr: &str, copy: (u32, u64), keys: &[u64]) -> Vec<Vec<f32>> {
    try_read_rows(addr, copy, keys).unwrap()
}

/// [`read_rows`], or the refusal (a copy not yet the primary of that epoch).
fn try_read_rows(
    addr: &str,
    (shard, epoch): (u32, u64),
    keys: &[u64],
) -> Result<Vec<Vec<f32>>, String> {
    use sparta_proto::wire::{self, Compression};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_ps::replica::copy_client(addr, TOKEN, (shard, epoch), None).unwrap();
        let r = c
            .pull(sparta_proto::pb::PullRequest {
                keys: wire::keys_to_bytes(keys),
                tables: vec![sparta_proto::pb::TableSpec {
                    table: 0,
                    dim: 16,
                    classes: 0,
                }],
                create: false,
                ..Default::default()
            })
            .await
            .map_err(|s| s.message().to_string())?
            .into_inner();
        let v = wire::values_to_vec(&r.values[0], Compression::None, keys.len() * 16).unwrap();
        Ok(v.chunks(16).map(|c| c.to_vec()).collect())
    })
}

/// `--replicas 2` with eviction: after training every backup's rows equal its primary's
/// (checksums), and once shard 0's primary is killed and its backup promoted, the promoted
/// copy serves no evicted row (a pull without create of the first file's ids reads zeros)
/// while the last rows' ids are there.
#[test]
fn backups_evict_with_their_primaries_and_a_failover_serves_no_evicted_row() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let files = churn_files(d, 4, 2000);
    let config = job(
        d,
        "job.toml",
        "[embedding]\neviction = { max_idle_steps = 4 }\n",
    );
    let ports = common::free_ports(3);
    let (coord_addr, addrs) = (ports[2].clone(), ports[..2].to_vec());
    let peers = addrs.join(",");
    let mut ps: Vec<Option<Proc>> = (0..2)
        .map(|i| {
            let shard = i.to_string();
            let args = [
                "--shard",
                &shard,
                "--num-shards",
                "2",
                "--workers",
                "2",
                "--config",
                s(&config),
                "--listen",
                &addrs[i],
                "--replicas",
                "2",
                "--peers",
                &peers,
            ];
            Some(start_ps(&args, Some(TOKEN)).0)
        })
        .collect();
    let mut coord = cmd(&["coordinator", "--ps", &peers, "--replicas", "2"]);
    coord
        .args(["--listen", &coord_addr, "--dead-after-ms", "800"])
        .env("SPARTA_TOKEN", TOKEN);
    let mut coord = Proc::start(coord);
    coord.wait_line(LIMIT, |l| l.contains("coordinator listening").then_some(()));
    let workers: Vec<Proc> = (0..2)
        .map(|rank| {
            let mut c = cmd(&["worker", "--rank", &rank.to_string(), "--num-workers", "2"]);
            c.args(["--ps", &peers, "--coordinator", &coord_addr])
                .args(["--config", s(&config), "--quiet"])
                .arg("--train")
                .args(paths(&files))
                .env("SPARTA_TOKEN", TOKEN);
            Proc::start(c)
        })
        .collect();
    for w in workers {
        let (ok, log) = w.wait(LIMIT);
        assert!(ok, "{log}");
    }
    let sums = checksums(&addrs);
    assert_eq!(sums.len(), 4, "{sums:?}");
    let fresh = 4 * 2000 * (26 - RECURRING) as u64;
    let mut rows = 0;
    for shard in 0..2u32 {
        let copies: Vec<_> = sums.iter().filter(|c| c.0 == shard).collect();
        let primary = copies.iter().find(|c| c.2).expect("a primary");
        let backup = copies.iter().find(|c| !c.2).expect("a backup");
        assert_eq!(
            primary.3, backup.3,
            "shard {shard}: the backup differs from its primary after evictions"
        );
        rows += primary.3.iter().map(|t| t.1).sum::<u64>();
    }
    assert!(
        rows * 2 < fresh,
        "the shards evicted: {rows} rows of {fresh} ids"
    );
    // Shard 0's ids: of the first file (long evicted) and of the last rows of every file
    // (the last steps of both workers: some still held).
    let of_shard0 = |keys: Vec<u64>| -> Vec<u64> {
        keys.into_iter()
            .filter(|&k| sparta_core::Routing::even(2).shard_of(k) == 0)
            .collect()
    };
    let evicted = of_shard0(fresh_keys(0, 2000, 0..2000));
    let recent = of_shard0(
        (0..4)
            .flat_map(|f| fresh_keys(f, 2000, 1990..2000))
            .collect(),
    );
    let live = |rows: &[Vec<f32>]| rows.iter().filter(|r| r.iter().any(|&x| x != 0.0)).count();
    assert_eq!(live(&read_rows(&addrs[0], (0, 0), &evicted)), 0);
    let held_before = live(&read_rows(&addrs[0], (0, 0), &recent));
    assert!(held_before > 0, "none of {} recent ids held", recent.len());
    // Kill shard 0's primary: its backup on process 1 takes over.
    let victim = ps[0].take().unwrap();
    common::kill9(victim.pid());
    drop(victim);
    let (_, shards) = common::wait_for("shard 0's failover", LIMIT, || {
        let r = routes(&coord_addr);
        (r.0 >= 1).then_some(r)
    });
    let (_, epoch, primary) = shards.iter().find(|s| s.0 == 0).unwrap().clone();
    assert_eq!(primary, addrs[1], "{shards:?}");
    // The coordinator's map names the new primary before its order reaches the copy (the
    // next heartbeat): until then the copy refuses as a backup, as a worker would be told.
    let first: Vec<Vec<f32>> = common::wait_for("the promoted copy serving", LIMIT, || {
        try_read_rows(&addrs[1], (0, epoch), &evicted).ok()
    });
    assert_eq!(live(&first), 0, "the promoted copy serves evicted rows");
    assert_eq!(
        live(&read_rows(&addrs[1], (0, epoch), &recent)),
        held_before,
        "the promoted copy holds the rows its primary held"
    );
    drop(ps);
    drop(coord);
}

/// Rows of every table of the PS at `addr` (the `Info` RPC).
fn info_rows(addr: &str) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = sparta_ps::replica::peer_client(addr, TOKEN, 64 << 20, None).unwrap();
        c.info(sparta_proto::pb::InfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .rows
    })
}

/// `kill -9` of a PS mid-job and the rollback to the last checkpoint: the job finishes, its
/// incremental checkpoints record the evictions (parts with removed rows), and a restore (what
/// a rollback does) of the first chain's last incremental checkpoint brings no evicted row
/// back: none of the first file's ids (which the chain's full checkpoint holds), exactly the
/// rows the checkpoint recorded.
#[test]
fn a_rollback_restore_brings_no_evicted_row_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let files = churn_files(d, 8, 2000);
    let config = job(
        d,
        "job.toml",
        "[embedding]\neviction = { max_idle_steps = 4 }\n",
    );
    let ckpt = d.join("ckpt");
    let mut c = cmd(&["launch", "--ps", "2", "--workers", "2", "--mode", "sync"]);
    c.args(["--config", s(&config), "--quiet", "--seed", "7"])
        .arg("--train")
        .args(paths(&files))
        .args([
            "--checkpoint-dir",
            s(&ckpt),
            "--checkpoint-every-steps",
            "4",
        ])
        .args(["--max-restarts", "4", "--ps-retry-secs", "20"]);
    let mut job_proc = Proc::start(c);
    job_proc.wait_until("3 checkpoints", LIMIT, || {
        (common::committed(&ckpt).len() >= 3).then_some(())
    });
    let ps1 = job_proc.started_pid("ps1").unwrap();
    common::kill9(ps1);
    job_proc.wait_started("ps1", Some(ps1), LIMIT);
    let (ok, log) = job_proc.wait(LIMIT);
    assert!(ok, "{log}");
    assert!(log.contains("launch: using checkpoint ckpt-"), "{log}");
    let o = cmd(&["checkpoint", "inspect", "--json", s(&ckpt)])
        .output()
        .unwrap();
    common::ok(&o, "checkpoint inspect");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cks = report["checkpoints"].as_array().unwrap();
    let removed: u64 = cks
        .iter()
        .flat_map(|c| c["tables"].as_array().unwrap())
        .map(|t| t["removed"].as_u64().unwrap())
        .sum();
    assert!(removed > 0, "no checkpoint recorded an eviction: {report}");
    // The first chain: its full checkpoint (early: it holds the first file's rows) and its
    // last incremental one (by then every row of the first file was evicted).
    let kind = |c: &serde_json::Value| c["kind"].as_str().unwrap_or("-").to_string();
    assert_eq!(kind(&cks[0]), "full", "{report}");
    let chain = cks[1..]
        .iter()
        .take_while(|c| kind(c) == "incremental")
        .count();
    assert!(chain >= 2, "{report}");
    let (full, incremental) = (&cks[0], &cks[chain]);
    let recorded = |c: &serde_json::Value| -> u64 {
        c["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["table_rows"].as_u64().unwrap())
            .sum()
    };
    let first_file = fresh_keys(0, 2000, 0..2000);
    let (rows, first_held) = restore(&config, &ckpt, full["id"].as_u64().unwrap(), &first_file);
    assert_eq!(
        rows,
        recorded(full),
        "rows restored vs recorded in {}",
        full["dir"]
    );
    assert!(
        first_held > 0,
        "the full checkpoint holds the first file's rows"
    );
    let (rows, first_held) = restore(
        &config,
        &ckpt,
        incremental["id"].as_u64().unwrap(),
        &first_file,
    );
    assert_eq!(
        rows,
        recorded(incremental),
        "rows restored vs recorded in {}",
        incremental["dir"]
    );
    assert_eq!(first_held, 0, "a restore brought evicted rows back");
}

/// Restores checkpoint `id` of `ckpt` into two fresh shards: their rows, and how many of
/// `keys` they hold.
fn restore(config: &Path, ckpt: &Path, id: u64, keys: &[u64]) -> (u64, usize) {
    let id = id.to_string();
    let ps: Vec<(Proc, String)> = (0..2)
        .map(|i| {
            let shard = i.to_string();
            let args = [
                "--shard",
                &shard,
                "--num-shards",
                "2",
                "--workers",
                "2",
                "--mode",
                "sync",
                "--config",
                s(config),
                "--resume",
                s(ckpt),
                "--resume-id",
                &id,
            ];
            start_ps(&args, Some(TOKEN))
        })
        .collect();
    let rows = ps.iter().map(|(_, a)| info_rows(a)).sum();
    let mut held = 0;
    for (shard, (_, addr)) in ps.iter().enumerate() {
        let mine: Vec<u64> = keys
            .iter()
            .copied()
            .filter(|&k| sparta_core::Routing::even(2).shard_of(k) == shard)
            .collect();
        held += read_rows(addr, (shard as u32, 0), &mine)
            .iter()
            .filter(|r| r.iter().any(|&x| x != 0.0))
            .count();
    }
    (rows, held)
}

#[test]
fn a_memory_limit_that_is_not_a_size_is_refused_naming_the_flag() {
    for (args, flag) in [
        (
            &["ps", "--shard", "0", "--num-shards", "1"][..],
            "--memory-limit",
        ),
        (
            &["launch", "--ps", "1", "--workers", "1"][..],
            "--ps-memory-limit",
        ),
    ] {
        let o = cmd(args).args([flag, "6 parsecs"]).output().unwrap();
        assert!(!o.status.success());
        let err = common::stderr(&o);
        assert!(err.contains(flag) && err.contains("unknown unit"), "{err}");
    }
}

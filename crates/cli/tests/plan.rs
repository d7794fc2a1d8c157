//! `sparta plan` through the real binary: its numbers move as they must with the ids, the
//! machine memory and the rate, and its predictions of a worker's sparse wire bytes and of the
//! shards' table bytes hold against a `sparta launch` of the same job on the same data.

mod common;

use std::path::{Path, PathBuf};

use common::{json, ok, s, sparta, stderr};

/// A small job of the Criteo layout: batches of 1024, 8-wide rows, a small MLP.
const SMALL: &str = "[data]\nbatch_size = 1024\n[embedding]\ndim = 8\n[model]\nkind = \"wdl\"\n\
                     hidden = [32, 16]\n[train]\nthreads = 1\n";

fn small_config(dir: &Path) -> PathBuf {
    let p = dir.join("small.toml");
    std::fs::write(&p, SMALL).unwrap();
    p
}

/// Runs `sparta plan --json` with `args` and returns its object.
fn plan(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["plan", "--json"];
    all.extend_from_slice(args);
    let o = sparta(&all);
    ok(&o, "plan");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "plan printed no JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn a_small_plan_grows_with_the_ids_halves_a_shard_with_the_memory_and_scales_the_network() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let run = |ids: &str, memory: &str, rate: &str| {
        plan(&[
            "--config",
            s(&cfg),
            "--ids",
            ids,
            "--machine-memory",
            memory,
            "--samples-per-sec",
            rate,
            "--machine-cores",
            "16",
            "--sample-rows",
            "4000",
        ])
    };
    let base = run("embedding=1e9", "64GiB", "1M");
    let ps = |p: &serde_json::Value| p["ps"]["count"].as_u64().unwrap();
    let shard = |p: &serde_json::Value| f(&p["ps"]["shard_table_bytes"]);
    // The ids and the rows: wide defaults to the deep table's count.
    let tables = base["tables"].as_array().unwrap();
    assert_eq!(tables[0]["name"], "embedding");
    assert_eq!(tables[0]["ids"], 1_000_000_000u64);
    assert_eq!(tables[1]["name"], "wide");
    assert_eq!(tables[1]["ids"], 1_000_000_000u64);
    assert_eq!(tables[1]["ids_given"], false);
    // Bytes per row: at least the payload (key + weights + optimizer state), measured.
    for t in tables {
        assert!(
            f(&t["bytes_per_row"]) > f(&t["payload_bytes_per_row"]),
            "{t}"
        );
        assert_eq!(t["measured_rows"], 1_000_000);
    }
    // The shard fits under 90 % of its limit, and one shard fewer would not.
    assert_eq!(base["ps"]["fits"], true);
    assert!(f(&base["ps"]["shard_bytes"]) <= f(&base["ps"]["budget_bytes"]));
    assert_eq!(base["ps"]["memory_limit"], "60GiB");
    let total: f64 = tables.iter().map(|t| f(&t["total_bytes"])).sum();
    assert!(
        total / (ps(&base) - 1) as f64 > f(&base["ps"]["budget_bytes"]),
        "{} shards would have held {total} bytes of rows",
        ps(&base) - 1
    );

    // Ten times the ids: more shards.
    let more = run("embedding=1e10", "64GiB", "1M");
    assert!(
        ps(&more) > 5 * ps(&base),
        "{} then {}",
        ps(&base),
        ps(&more)
    );

    // Half the memory (less the same headroom: 28 GiB of limit against 60): twice the shards
    // or so, each holding about half the rows.
    let half = run("embedding=1e9", "32GiB", "1M");
    assert_eq!(half["ps"]["memory_limit"], "28GiB");
    let ratio = shard(&half) / shard(&base);
    assert!(
        (0.4..=0.6).contains(&ratio),
        "{} shards of {} then {} of {}",
        ps(&base),
        shard(&base),
        ps(&half),
        shard(&half)
    );
    assert!(
        ps(&half) >= 2 * ps(&base) - 1,
        "{} then {}",
        ps(&base),
        ps(&half)
    );

    // Twice the rate: the same bytes per sample, twice the network of every PS link.
    let fast = run("embedding=1e9", "64GiB", "2M");
    assert_eq!(ps(&fast), ps(&base));
    assert_eq!(
        fast["wire"]["bytes_per_sample"],
        base["wire"]["bytes_per_sample"]
    );
    let link = |p: &serde_json::Value| f(&p["network"]["per_ps_bytes_per_sec"]);
    assert!((link(&fast) / link(&base) - 2.0).abs() < 1e-9);
    assert!(f(&base["network"]["per_ps_bytes_per_sec"]) > 0.0);
    // Workers: the CPU time measured, times the rate, over the cores at the efficiency.
    let w = &base["workers"];
    let want = (1e6 * f(&w["cpu_seconds_per_sample"]) / (16.0 * f(&w["efficiency"]))).ceil();
    assert_eq!(f(&w["count"]), want.max(1.0), "{w}");
    assert!(f(&w["cpu_seconds_per_sample"]) > 0.0, "{w}");
    let launch = base["commands"]["launch"].as_str().unwrap();
    assert!(
        launch.starts_with(&format!(
            "sparta launch --ps {} --workers {} --ps-memory-limit 60GiB",
            ps(&base),
            w["count"]
        )),
        "{launch}"
    );
}

#[test]
fn the_plan_predicts_the_sparse_wire_bytes_and_table_bytes_a_launch_measures() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let data = dir.path().join("t.tsv");
    let o = sparta(&[
        "gen-data",
        "--rows",
        "20000",
        "--seed",
        "1",
        "--out",
        s(&data),
    ]);
    ok(&o, "gen-data");
    let summary = dir.path().join("job.json");
    let o = sparta(&[
        "launch",
        "--ps",
        "2",
        "--workers",
        "1",
        "--config",
        s(&cfg),
        "--train",
        s(&data),
        "--quiet",
        "--summary-json",
        s(&summary),
    ]);
    ok(&o, "launch");
    let job = json(&summary);
    let measured_wire = f(&job["per_worker"][0]["wire"]["sparse_bytes_per_sample"]);
    // Every shard's tables: their rows (the ids the run created) and bytes.
    let (mut rows, mut bytes) = (std::collections::BTreeMap::new(), 0.0);
    for shard in job["shard_tables"].as_array().unwrap() {
        for (name, t) in shard["tables"].as_object().unwrap() {
            *rows.entry(name.clone()).or_insert(0u64) += t["rows"].as_u64().unwrap();
            bytes += f(&t["bytes"]);
        }
    }
    assert_eq!(rows.len(), 2, "{rows:?}");
    let ids = format!("embedding={},wide={}", rows["embedding"], rows["wide"]);

    let p = plan(&[
        "--config",
        s(&cfg),
        "--ps",
        "2",
        "--ids",
        &ids,
        "--data",
        s(&data),
        "--sample-rows",
        "20000",
        "--machine-memory",
        "8GiB",
        "--samples-per-sec",
        "100000",
    ]);
    let predicted_wire = f(&p["wire"]["sparse_bytes_per_sample"]);
    assert!(
        (predicted_wire / measured_wire - 1.0).abs() <= 0.15,
        "sparse bytes per sample: predicted {predicted_wire}, measured {measured_wire}"
    );
    let predicted_bytes: f64 = p["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| f(&t["bytes_per_shard"]))
        .sum::<f64>()
        * 2.0;
    assert!(
        (predicted_bytes / bytes - 1.0).abs() <= 0.25,
        "table bytes: predicted {predicted_bytes}, the shards hold {bytes}"
    );
    assert_eq!(p["ps"]["count"], 2);
}

#[test]
fn a_table_the_job_lacks_is_refused_naming_its_tables() {
    let o = sparta(&[
        "plan",
        "--ids",
        "item=1e9",
        "--machine-memory",
        "64GiB",
        "--samples-per-sec",
        "1M",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("no physical table \"item\"") && e.contains("embedding (rows of C1"),
        "{e}"
    );
    let o = sparta(&[
        "plan",
        "--ids",
        "embedding=0",
        "--machine-memory",
        "64GiB",
        "--samples-per-sec",
        "1M",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("must be above 0"), "{}", stderr(&o));
}

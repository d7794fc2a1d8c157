//! What a cluster's checkpoints hold, from `sparta checkpoint inspect --json`.

use std::collections::BTreeMap;
use std::path::Path;

use super::{cmd, ok, s};

/// `checkpoint inspect --json` of the newest checkpoint in `dir`.
pub fn newest(dir: &Path) -> serde_json::Value {
    let o = cmd(&["checkpoint", "inspect", "--json", s(dir)])
        .output()
        .unwrap();
    ok(&o, "checkpoint inspect");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    r["checkpoints"].as_array().unwrap().last().unwrap().clone()
}

/// Rows per (table, part) a checkpoint restores, from `inspect`.
pub fn rows_per_part(c: &serde_json::Value) -> Vec<(String, String, u64)> {
    let mut v: Vec<(String, String, u64)> = c["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["table"].as_str().unwrap().to_string(),
                p["part"].as_str().unwrap().to_string(),
                p["table_rows"].as_u64().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Rows per table a checkpoint restores (summed over its parts).
pub fn rows_per_table(c: &serde_json::Value) -> BTreeMap<String, u64> {
    let mut t = BTreeMap::new();
    for (table, _, n) in rows_per_part(c) {
        *t.entry(table).or_default() += n;
    }
    t
}

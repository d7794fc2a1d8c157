//! Checkpoint file readers (the envelope's `FileReader` / `read_small`, table-part rows files,
//! the dense file, the manifest) through the public entry points `inspect`, `newest_valid`
//! and `restore_latest`: a valid chain (full + incremental, with dense state) is written to
//! memory once; each input replaces one of its files by the fuzz bytes, as a whole file or
//! as the payload of a well-formed envelope (so the payload decoders run past the header and
//! checksum). Readers return errors, never panic, never allocate from an unchecked length
//! (libFuzzer's -rss_limit_mb / -malloc_limit_mb catch that).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sparta_checkpoint::format::{read_small, write_small, FileKind};
use sparta_checkpoint::{
    inspect, newest_valid, restore_latest, CheckpointState, Checkpointer, DenseState,
    InputPosition, RetentionPolicy,
};
use sparta_fuzz::{mutate, payload_of, Edit, MemStorage};
use sparta_nn::optim::OptimizerState;
use sparta_table::{RowPrecision, Table, TableConfig};

/// A table of dim 4 storing its weights at `precision`.
fn config(name: &str, precision: RowPrecision) -> TableConfig {
    TableConfig {
        name: name.into(),
        dim: 4,
        shards: 1,
        precision,
        ..TableConfig::default()
    }
}

fn make_table(_name: &str, cfg: &TableConfig) -> Result<Table, sparta_table::TableError> {
    Table::new(cfg.clone())
}

/// A full and an incremental checkpoint of small tables (f32, and compact: bf16 and int8
/// weights in their stored form) with dense state.
fn valid() -> &'static MemStorage {
    static S: OnceLock<MemStorage> = OnceLock::new();
    S.get_or_init(|| {
        let s = MemStorage::default();
        let ck = Checkpointer::new(
            std::sync::Arc::new(s.clone()),
            RetentionPolicy { keep_full: 0 },
        );
        let t = Table::new(config("emb", RowPrecision::F32)).unwrap();
        let t16 = Table::new(config("emb16", RowPrecision::Bf16)).unwrap();
        let t8 = Table::new(config("emb8", RowPrecision::Int8)).unwrap();
        let params = [0.25f32, -1.0, 3.0];
        let optimizer = OptimizerState {
            step: 2,
            slot1: vec![0.1; 3],
            slot2: Vec::new(),
        };
        for i in 0..2u64 {
            let keys: Vec<u64> = (0..20).map(|k| ((k % 3) << 56) | (k + 10 * i)).collect();
            let mut out = vec![0f32; keys.len() * 4];
            for table in [&t, &t16, &t8] {
                table.pull(&keys, &mut out);
            }
            let state = CheckpointState {
                tables: vec![("emb", &t), ("emb16", &t16), ("emb8", &t8)],
                dense: Some(DenseState {
                    params: &params,
                    optimizer: &optimizer,
                }),
                step: 5 * (i + 1),
                position: InputPosition::default(),
                job_config: "[job]",
            };
            if i == 0 {
                ck.write_full(&state).unwrap();
            } else {
                ck.write_incremental(&state).unwrap();
            }
        }
        s
    })
}

fn kind_of(name: &str) -> FileKind {
    if name.ends_with(".rows") {
        FileKind::TableRows
    } else if name.contains("dense") {
        FileKind::Dense
    } else {
        FileKind::Manifest
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, fuzz)) = data.split_first() else {
        return;
    };
    let s = valid().deep_clone();
    let names = s.names();
    let name = &names[(pick & 0xf) as usize % names.len()];
    let kind = kind_of(name);
    let edit = Edit::from_bits(pick >> 4);
    let original = s.bytes(name).unwrap();
    if pick & 0x40 == 0 {
        // The whole file: header, payload, footer.
        s.set(name, mutate(&original, edit, fuzz));
    } else {
        // The payload, in a well-formed envelope (valid header, length and checksum).
        let payload = mutate(payload_of(&original), edit, fuzz);
        write_small(&s, name, kind, &payload).unwrap();
    }
    let _ = read_small(&s, name, kind, 1 << 20);
    let _ = inspect(&s);
    let _ = newest_valid(&s);
    if let Ok(Some(r)) = restore_latest(&s, make_table) {
        assert!(!r.chain.is_empty());
        assert_eq!(r.chain.last(), Some(&r.id));
    }
});

//! The HTTP predict request: a JSON body (`rows` objects or `tsv` lines) turned into the
//! batch the trainer would have parsed, for each schema kind (the first byte picks). An
//! accepted body gives one well-formed row per requested row (finite dense values and
//! weights, ids in their slots' key spaces); anything else is a `BadRequest`, never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sparta_fuzz::{layouts, Layout};
use sparta_serve::request::RequestParser;

/// Most rows a request may hold here (the server's limit is a flag).
const MAX_ROWS: usize = 64;

fn parsers() -> &'static [(Layout, RequestParser)] {
    static P: OnceLock<Vec<(Layout, RequestParser)>> = OnceLock::new();
    P.get_or_init(|| {
        layouts()
            .into_iter()
            .map(|l| {
                let p = RequestParser::new(&l.schema, &l.plan);
                (l, p)
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let ps = parsers();
    let (layout, parser) = &ps[pick as usize % ps.len()];
    let Ok(batch) = parser.parse_body(body, MAX_ROWS) else {
        return;
    };
    let v: serde_json::Value = serde_json::from_slice(body).expect("an accepted body is JSON");
    let n = ["rows", "tsv"]
        .iter()
        .find_map(|k| v.get(*k).and_then(|x| x.as_array()).map(Vec::len))
        .expect("an accepted body has rows or tsv");
    assert!((1..=MAX_ROWS).contains(&n));
    assert_eq!(batch.rows, n, "{}: one row per requested row", layout.name);
    if let Err(e) = batch.check_tags(&layout.tags()) {
        panic!("{}: {e}", layout.name);
    }
    assert!(
        batch.dense.iter().all(|x| x.is_finite()),
        "{}: dense {:?}",
        layout.name,
        batch.dense
    );
    assert!(batch.weights.iter().all(|w| w.is_finite()));
});

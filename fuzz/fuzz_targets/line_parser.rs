//! The line parser over every schema kind: the first byte picks the layout, the rest is cut
//! into lines. An accepted line adds exactly one well-formed row (labels 0/1, finite dense
//! values and weights, every id in its slot's key space); a rejected one adds nothing.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sparta_data::LineParser;
use sparta_fuzz::{layouts, Layout};

struct Parsers {
    layouts: Vec<Layout>,
    parsers: Vec<LineParser>,
}

fn parsers() -> &'static Parsers {
    static P: OnceLock<Parsers> = OnceLock::new();
    P.get_or_init(|| {
        let layouts = layouts();
        let parsers = layouts
            .iter()
            .map(|l| LineParser::with_plan(&l.schema, &l.plan))
            .collect();
        Parsers { layouts, parsers }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, text)) = data.split_first() else {
        return;
    };
    let p = parsers();
    let i = pick as usize % p.parsers.len();
    let (layout, parser) = (&p.layouts[i], &p.parsers[i]);
    let mut out = parser.builder(16);
    let mut ok = 0;
    for line in text.split(|&b| b == b'\n') {
        let (rows, ids) = (out.rows(), out.num_ids());
        match parser.parse_line(line, &mut out) {
            Ok(()) => {
                ok += 1;
                assert_eq!(
                    out.rows(),
                    rows + 1,
                    "{}: an Ok line adds one row",
                    layout.name
                );
                assert!(out.num_ids() >= ids + parser.num_fields());
            }
            Err(e) => {
                assert_eq!(
                    out.rows(),
                    rows,
                    "{}: a bad line ({e}) adds no row",
                    layout.name
                );
                assert_eq!(
                    out.num_ids(),
                    ids,
                    "{}: a bad line ({e}) adds no id",
                    layout.name
                );
            }
        }
    }
    let batch = out.take();
    assert_eq!(batch.rows, ok);
    assert_eq!(batch.num_fields, layout.plan.num_slots());
    assert_eq!(batch.num_dense, layout.plan.num_dense());
    if let Err(e) = batch.check_tags(&layout.tags()) {
        panic!("{}: {e}", layout.name);
    }
    assert!(batch.labels.iter().all(|&l| l == 0.0 || l == 1.0));
    assert!(
        batch.dense.iter().all(|x| x.is_finite()),
        "{}: dense values {:?}",
        layout.name,
        batch.dense
    );
    assert!(batch.weights.iter().all(|w| w.is_finite()));
    if !parser.is_weighted() {
        assert!(batch.weights.is_empty());
    }
});

//! Resolving `[[tables]]` / `[[features]]` into the plan, the physical tables and the
//! slot layout.

use crate::config::JobConfig;
use sparta_data::features::InputPlan;
use sparta_data::Schema;

fn err(text: &str) -> String {
    JobConfig::from_toml(text)
        .and_then(|c| c.validate())
        .unwrap_err()
        .to_string()
}

const SCHEMA: &str = r#"
[data]
format = "custom"
[data.schema]
columns = [
  { name = "label", kind = "label" },
  { name = "price", kind = "dense" },
  { name = "user", kind = "sparse" },
  { name = "item", kind = "sparse" },
  { name = "hist", kind = "multi_sparse", separator = "|" },
]
"#;

#[test]
fn a_job_without_features_keeps_its_keys_tables_and_plan() {
    for (fmt, schema) in [("criteo", Schema::criteo()), ("avazu", Schema::avazu())] {
        let job = JobConfig::from_toml(&format!("[data]\nformat = \"{fmt}\"\n"))
            .unwrap()
            .validate()
            .unwrap();
        let f = &job.features;
        assert_eq!(f.plan, InputPlan::legacy(&schema));
        let names: Vec<&str> = f.physical.iter().map(|p| p.config.name.as_str()).collect();
        assert_eq!(names, ["embedding", "wide"]);
        assert_eq!(f.physical[0].config.dim, 16);
        assert_eq!(f.tables.len(), schema.num_fields());
        assert!(f.slots.iter().all(|s| s.wide && s.physical == 0));
        assert_eq!(f.emb_width, 16 * schema.num_fields());
        assert_eq!(job.model.emb_width(), f.emb_width);
    }
    // dcn: no wide table, no wide class.
    let job = JobConfig::from_toml("[model]\nkind = \"dcn\"\n")
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(job.features.physical.len(), 1);
    assert!(job.features.wide_table.is_none());
}

#[test]
fn the_printed_explicit_config_means_the_same_job() {
    let implicit = JobConfig::from_toml("[embedding]\ndim = 8\n").unwrap();
    let mut explicit = implicit.clone();
    explicit.make_features_explicit().unwrap();
    assert!(!explicit.tables.is_empty() && !explicit.features.is_empty());
    let text = toml::to_string(&explicit).unwrap();
    let back = JobConfig::from_toml(&text).unwrap().validate().unwrap();
    let a = implicit.validate().unwrap();
    assert_eq!(a.features.plan, back.features.plan);
    assert_eq!(a.features.physical, back.features.physical);
    assert_eq!(a.features.slots, back.features.slots);
    assert_eq!(a.model, back.model);
}

#[test]
fn shared_tables_groups_and_classes() {
    let job = JobConfig::from_toml(&format!(
        "{SCHEMA}
[[tables]]
name = \"user\"
dim = 8
[[tables]]
name = \"item\"
dim = 16
[[tables]]
name = \"price\"
dim = 8
[[features]]
name = \"user\"
kind = \"id\"
table = \"user\"
wide = false
[[features]]
name = \"item\"
kind = \"id\"
table = \"item\"
[[features]]
name = \"hist\"
kind = \"sequence\"
table = \"item\"
max_len = 5
[[features]]
name = \"price_b\"
column = \"price\"
kind = \"numeric\"
transform = \"buckets\"
boundaries = [1.0, 5.0]
table = \"price\"
[[features]]
name = \"price\"
kind = \"numeric\"
transform = \"standardize\"
mean = 3.0
std = 2.0
"
    ))
    .unwrap()
    .validate()
    .unwrap();
    let f = &job.features;
    // user and price share settings (dim 8): one physical table; item another; wide.
    let names: Vec<&str> = f.physical.iter().map(|p| p.config.name.as_str()).collect();
    assert_eq!(names, ["embedding", "embedding.1", "wide"]);
    assert_eq!(f.physical[0].members, vec![0, 2]);
    // item and hist share table item: same tag, same physical table.
    assert_eq!(f.slots[1].table, f.slots[2].table);
    assert_eq!(f.plan.slots[1].tag, f.plan.slots[2].tag);
    assert_eq!(f.slots[2].sequence, Some(5));
    assert!(!f.slots[2].wide && f.slots[1].wide && !f.slots[0].wide);
    // classes: user (no wide) and price (wide) differ; every class in exactly one deep table.
    assert_ne!(f.class_of_tag[0], f.class_of_tag[2]);
    let deep_masks: u64 = f.physical[..2].iter().map(|p| p.classes).fold(0, |a, m| {
        assert_eq!(a & m, 0);
        a | m
    });
    for t in &f.tables {
        let c = f.class_of_tag[t.tag as usize];
        assert_eq!(deep_masks >> c & 1, 1);
        assert_eq!(f.physical[2].classes >> c & 1 == 1, t.wide, "{}", t.name);
    }
    assert_eq!(f.emb_width, 8 + 16 + 16 + 8);
    assert_eq!(job.model.feature_dims, vec![8, 16, 16, 8]);
    assert_eq!(f.plan.dense.len(), 1);
}

#[test]
fn errors_name_the_table_or_feature() {
    let t = "[[tables]]\nname = \"t\"\ndim = 4\n";
    let cases = [
        (
            format!("{SCHEMA}{t}[[features]]\nname = \"user\"\nkind = \"id\"\ntable = \"nope\"\n"),
            "feature \"user\": unknown table \"nope\"",
        ),
        (
            format!("{SCHEMA}{t}[[features]]\nname = \"age\"\nkind = \"id\"\ntable = \"t\"\n"),
            "feature \"age\": column \"age\" is not in the schema",
        ),
        (
            format!("{SCHEMA}{t}[[features]]\nname = \"user\"\nkind = \"sequence\"\nmax_len = 3\ntable = \"t\"\n"),
            "feature \"user\" reads column \"user\" of kind \"sparse\"",
        ),
        (
            format!("{SCHEMA}{t}[[features]]\nname = \"user\"\nkind = \"id\"\npooling = \"mean\"\ntable = \"t\"\n"),
            "feature \"user\": `pooling` applies to kind = \"bag\" only",
        ),
        (
            format!("{SCHEMA}{t}[[features]]\nname = \"hist\"\nkind = \"sequence\"\ntable = \"t\"\n"),
            "feature \"hist\": kind = \"sequence\" needs `max_len`",
        ),
        (
            format!("{SCHEMA}{t}[[tables]]\nname = \"u\"\ndim = 4\n[[features]]\nname = \"user\"\nkind = \"id\"\ntable = \"t\"\n"),
            "table \"u\" is not used by any feature",
        ),
        (
            format!("{SCHEMA}[model]\nkind = \"deepfm\"\n{t}[[tables]]\nname = \"u\"\ndim = 8\n[[features]]\nname = \"user\"\nkind = \"id\"\ntable = \"t\"\n[[features]]\nname = \"item\"\nkind = \"id\"\ntable = \"u\"\n"),
            "needs every sparse feature at one dim",
        ),
        (
            format!("{SCHEMA}[model]\nkind = \"dlrm\"\n{t}[[tables]]\nname = \"u\"\ndim = 8\n[[features]]\nname = \"user\"\nkind = \"id\"\ntable = \"t\"\n[[features]]\nname = \"item\"\nkind = \"id\"\ntable = \"u\"\n"),
            "model.kind = \"dlrm\" needs every sparse feature at one dim (its interaction takes dot products): feature \"user\" has dim 4, feature \"item\" has dim 8",
        ),
        (
            format!("{SCHEMA}[model]\nkind = \"dcn\"\n{t}[[features]]\nname = \"user\"\nkind = \"id\"\ntable = \"t\"\nwide = true\n"),
            "feature \"user\": wide = true, but the model has no first-order part",
        ),
        (
            format!("{SCHEMA}{t}[[features]]\nname = \"price\"\nkind = \"numeric\"\ntransform = \"standardize\"\n"),
            "feature \"price\": transform = \"standardize\" needs `mean`",
        ),
        (format!("{SCHEMA}{t}"), "add the features that use them"),
    ];
    for (text, want) in cases {
        let e = err(&text);
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    }
}

/// `precision` comes from `[embedding]` unless a table says otherwise, and tables stored at
/// different precisions never share a physical table; the wide table stays f32.
#[test]
fn tables_of_another_precision_get_their_own_physical_table() {
    use sparta_table::RowPrecision;
    let job = JobConfig::from_toml(&format!(
        "{SCHEMA}
[embedding]
precision = \"bf16\"
[[tables]]
name = \"user\"
dim = 8
[[tables]]
name = \"item\"
dim = 8
precision = \"f32\"
[[tables]]
name = \"price\"
dim = 8
[[features]]
name = \"user\"
kind = \"id\"
table = \"user\"
[[features]]
name = \"item\"
kind = \"id\"
table = \"item\"
[[features]]
name = \"hist\"
kind = \"bag\"
table = \"price\"
"
    ))
    .unwrap()
    .validate()
    .unwrap();
    let f = &job.features;
    let got: Vec<(&str, RowPrecision)> = f
        .physical
        .iter()
        .map(|p| (p.config.name.as_str(), p.config.precision))
        .collect();
    assert_eq!(
        got,
        [
            ("embedding", RowPrecision::Bf16),
            ("embedding.1", RowPrecision::F32),
            ("wide", RowPrecision::F32)
        ]
    );
    assert_eq!(f.physical[0].members, vec![0, 2]);
    assert!(err("[embedding]\nprecision = \"f8\"\n").contains("precision"));
}

/// `storage` (the SSD tier) comes from `[embedding]` unless a table says otherwise; a table
/// with its own budget gets its own physical table, the wide table stays in RAM, and a bad
/// storage section names the table and the field.
#[test]
fn storage_is_inherited_and_a_table_with_its_own_gets_its_own_physical_table() {
    let dir = std::env::temp_dir();
    let disk = format!("{:?}", dir.to_str().unwrap());
    let job = JobConfig::from_toml(&format!(
        "{SCHEMA}
[model]
kind = \"wdl\"
[embedding]
storage = {{ ram_rows = 1000, disk_dir = {disk} }}
[[tables]]
name = \"user\"
dim = 8
[[tables]]
name = \"item\"
dim = 8
storage = {{ ram_bytes = 1048576, disk_dir = {disk} }}
[[features]]
name = \"user\"
kind = \"id\"
table = \"user\"
wide = true
[[features]]
name = \"item\"
kind = \"id\"
table = \"item\"
"
    ))
    .unwrap()
    .validate()
    .unwrap();
    let got: Vec<(&str, Option<u64>, Option<u64>)> = job
        .features
        .physical
        .iter()
        .map(|p| {
            let st = p.config.storage.as_ref();
            (
                p.config.name.as_str(),
                st.and_then(|s| s.ram_rows),
                st.and_then(|s| s.ram_bytes),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("embedding", Some(1000), None),
            ("embedding.1", None, Some(1 << 20)),
            ("wide", None, None)
        ]
    );
    let bad = err(&format!(
        "{SCHEMA}[[tables]]\nname = \"user\"\ndim = 4\nstorage = {{ ram_rows = 5, disk_dir = \"/no/such/dir\" }}\n[[features]]\nname = \"user\"\nkind = \"id\"\ntable = \"user\"\n"
    ));
    assert!(
        bad.contains("table \"user\"") && bad.contains("storage disk_dir /no/such/dir"),
        "{bad}"
    );
    let unknown = err(&format!(
        "{SCHEMA}[embedding]\nstorage = {{ ram_rowz = 5, disk_dir = {disk} }}\n"
    ));
    assert!(unknown.contains("ram_rowz"), "{unknown}");
}

//! Deterministic synthetic click logs with feature columns (`sparta gen-data --profile rich`).
//!
//! Layout: header-less TSV, the columns of [`rich_schema`] (also `[data.schema]` in
//! `examples/rich.toml`):
//!
//! | column | kind | values |
//! | --- | --- | --- |
//! | `label` | label | 0 / 1 |
//! | `user_id` | sparse | `u<n>`, ~100k users, Zipf-like popularity |
//! | `gender` | sparse | `f`, `m`, `x` (a fixed function of the user) |
//! | `item_id` | sparse | `i<n>`, ~50k items, Zipf-like popularity |
//! | `item_cat` | sparse | `c<n>`, ~200 categories, a fixed function of the item |
//! | `tags` | multi_sparse `\|` | 1-5 items `t<n>:<weight>` of ~1000 tags |
//! | `hist_items` | multi_sparse `\|` | the last 0-30 items the user clicked, oldest first (`i<n>`) |
//! | `price` | dense | log-normal, a fixed function of the item |
//! | `conversion` | label | 0 / 1, 1 only on clicked rows |
//! | `hist_cats` | multi_sparse `\|` | the categories of `hist_items`, same order (`c<n>`) |
//!
//! The hidden click model (a logit): user and item effects, a strong bonus when the target
//! item's category is among the categories of the history items (drawn with the user's
//! category preferences), the weight-averaged effects of the tags, a non-monotone price effect
//! (a bump around the median price: buckets capture it, a monotone transform cannot), and a
//! gender x category interaction. The bias is calibrated to about 20% clicks.
//!
//! The hidden conversion model, drawn after a click only (so `conversion` implies `label`):
//! its own item and user effects, a monotone price effect (cheaper items convert more) and its
//! own gender x category interaction; the bias is calibrated to P(conversion | click) ~ 0.25
//! (about 5% of rows convert). Its draw uses a random stream of its own, so the other columns
//! of a row are those of the profile before the conversion was added.
//!
//! Row `i` depends only on `(seed, i)` and the models on `model_seed`. With an oracle, each
//! row's line there is `p_click \t p_ctcvr` (the true click probability and the true
//! probability of a click followed by a conversion).

use std::io::{self, Write};

use crate::schema::{Column, ColumnKind, Schema};
use crate::synth::{hash3, normal, sigmoid, Rng};

/// Users.
pub const USERS: u64 = 100_000;
/// Items.
pub const ITEMS: u64 = 50_000;
/// Item categories.
pub const CATEGORIES: u64 = 200;
/// Tags.
pub const TAGS: u64 = 1_000;
/// Longest click history.
pub const MAX_HISTORY: u64 = 30;
/// Logit bonus when the target's category is among the history's categories.
pub const HISTORY_BONUS: f64 = 1.2;

/// Generator settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RichConfig {
    /// Rows to write.
    pub rows: u64,
    /// Seed of the row sampling.
    pub seed: u64,
    /// Seed of the hidden click model (train and test files must share it).
    pub model_seed: u64,
}

impl Default for RichConfig {
    fn default() -> Self {
        RichConfig {
            rows: 100_000,
            seed: 1,
            model_seed: 42,
        }
    }
}

/// The layout of the rich profile's lines.
pub fn rich_schema() -> Schema {
    let multi = ColumnKind::MultiSparse { separator: '|' };
    Schema {
        columns: vec![
            Column::new("label", ColumnKind::Label),
            Column::new("user_id", ColumnKind::Sparse),
            Column::new("gender", ColumnKind::Sparse),
            Column::new("item_id", ColumnKind::Sparse),
            Column::new("item_cat", ColumnKind::Sparse),
            Column::new("tags", multi.clone()),
            Column::new("hist_items", multi.clone()),
            Column::new("price", ColumnKind::Dense),
            Column::new("conversion", ColumnKind::Label),
            Column::new("hist_cats", multi),
        ],
        separator: '\t',
        header: false,
    }
}

/// One sampled row.
struct Row {
    user: u64,
    item: u64,
    tags: Vec<(u64, f64)>,
    hist: Vec<u64>,
}

struct Model {
    seed: u64,
    /// Items of each category, most popular first.
    items_of: Vec<Vec<u64>>,
    bias: f64,
    /// Bias of the conversion logit.
    cvr_bias: f64,
}

// Salts of the model's hashes.
const USER_EFFECT: u64 = 1;
const USER_PREF: u64 = 2;
const ITEM_CAT: u64 = 3;
const ITEM_EFFECT: u64 = 4;
const ITEM_PRICE: u64 = 5;
const TAG_EFFECT: u64 = 6;
const GENDER_CAT: u64 = 7;
const GENDER: u64 = 8;
const ITEM_CVR: u64 = 9;
const USER_CVR: u64 = 10;
const GENDER_CAT_CVR: u64 = 11;
/// Salt of a row's conversion draw (its own stream: the other columns do not move).
const CONVERSION_DRAW: u64 = 0xC0417;

impl Model {
    fn new(seed: u64) -> Model {
        let mut items_of = vec![Vec::new(); CATEGORIES as usize];
        let mut m = Model {
            seed,
            items_of: Vec::new(),
            bias: 0.0,
            cvr_bias: 0.0,
        };
        for item in 0..ITEMS {
            items_of[m.category(item) as usize].push(item);
        }
        m.items_of = items_of;
        m.bias = m.calibrate(0.2);
        m.cvr_bias = m.calibrate_cvr(0.25);
        m
    }

    fn h(&self, salt: u64, a: u64) -> u64 {
        hash3(self.seed, salt, a)
    }

    fn category(&self, item: u64) -> u64 {
        self.h(ITEM_CAT, item) % CATEGORIES
    }

    fn gender(&self, user: u64) -> u64 {
        self.h(GENDER, user) % 3
    }

    /// The user's `k`-th preferred category (three of them).
    fn preference(&self, user: u64, k: u64) -> u64 {
        hash3(self.seed ^ USER_PREF, user, k) % CATEGORIES
    }

    fn price(&self, item: u64) -> f64 {
        // median ~ 20, a few items in the hundreds; two decimals as written
        let p = (3.0 + 0.9 * normal(self.h(ITEM_PRICE, item))).exp();
        (p * 100.0).round() / 100.0
    }

    /// An item of category `cat` (Zipf-like within the category).
    fn item_in(&self, cat: u64, rng: &mut Rng) -> u64 {
        let items = &self.items_of[cat as usize];
        if items.is_empty() {
            return rng.zipf(ITEMS);
        }
        items[rng.zipf(items.len() as u64) as usize]
    }

    /// A category the user likes (80%) or any.
    fn liked_category(&self, user: u64, rng: &mut Rng) -> u64 {
        if rng.unit() < 0.8 {
            let k = rng.below(3);
            self.preference(user, k)
        } else {
            rng.below(CATEGORIES)
        }
    }

    fn sample(&self, rng: &mut Rng) -> Row {
        let user = rng.zipf(USERS);
        let hist_len = rng.below(MAX_HISTORY + 1);
        let hist = (0..hist_len)
            .map(|_| {
                let c = self.liked_category(user, rng);
                self.item_in(c, rng)
            })
            .collect();
        // the target: from a liked category half the time, else by global popularity
        let item = if rng.unit() < 0.5 {
            let c = self.liked_category(user, rng);
            self.item_in(c, rng)
        } else {
            rng.zipf(ITEMS)
        };
        let n_tags = 1 + rng.below(5);
        let tags = (0..n_tags)
            .map(|_| {
                let t = rng.zipf(TAGS);
                let w = (1 + rng.below(100)) as f64 / 100.0;
                (t, w)
            })
            .collect();
        Row {
            user,
            item,
            tags,
            hist,
        }
    }

    /// True when the target's category is among the history's categories.
    fn category_in_history(&self, row: &Row) -> bool {
        let c = self.category(row.item);
        row.hist.iter().any(|&h| self.category(h) == c)
    }

    /// The non-monotone price effect: a bump around the median price.
    fn price_effect(price: f64) -> f64 {
        let z = (price.ln() - 3.0) / 0.5;
        0.9 * (-z * z).exp() - 0.3
    }

    fn logit(&self, row: &Row) -> f64 {
        let mut z = self.bias;
        z += 0.4 * normal(self.h(USER_EFFECT, row.user));
        z += 0.4 * normal(self.h(ITEM_EFFECT, row.item));
        if self.category_in_history(row) {
            z += HISTORY_BONUS;
        }
        let (mut num, mut den) = (0.0, 0.0);
        for &(t, w) in &row.tags {
            num += w * 0.6 * normal(self.h(TAG_EFFECT, t));
            den += w;
        }
        z += num / den;
        z += Self::price_effect(self.price(row.item));
        let cat = self.category(row.item);
        z += 0.5 * normal(hash3(self.seed ^ GENDER_CAT, self.gender(row.user), cat));
        z
    }

    /// The conversion logit of a clicked row (bias included).
    fn cvr_logit(&self, row: &Row) -> f64 {
        let mut z = self.cvr_bias;
        z += 0.6 * normal(self.h(ITEM_CVR, row.item));
        z += 0.3 * normal(self.h(USER_CVR, row.user));
        // cheaper converts more: minus the z-score of the log price
        z -= 0.5 * (self.price(row.item).ln() - 3.0) / 0.9;
        let cat = self.category(row.item);
        z += 0.5
            * normal(hash3(
                self.seed ^ GENDER_CAT_CVR,
                self.gender(row.user),
                cat,
            ));
        z
    }

    /// The fixed calibration sample.
    fn calibration_rows(&self) -> impl Iterator<Item = Row> + '_ {
        let mut rng = Rng(hash3(self.seed, 0xCA1, 0));
        (0..20_000).map(move |_| self.sample(&mut rng))
    }

    /// Bias giving a mean click probability of `target` on a fixed calibration sample.
    fn calibrate(&self, target: f64) -> f64 {
        let logits: Vec<f64> = self.calibration_rows().map(|r| self.logit(&r)).collect();
        bisect_bias(target, |b| {
            logits.iter().map(|z| sigmoid(z + b)).sum::<f64>() / logits.len() as f64
        })
    }

    /// Conversion bias giving a mean P(conversion | click) of `target` on the calibration
    /// sample (rows weighted by their click probability).
    fn calibrate_cvr(&self, target: f64) -> f64 {
        let rows: Vec<(f64, f64)> = self
            .calibration_rows()
            .map(|r| (sigmoid(self.logit(&r)), self.cvr_logit(&r) - self.cvr_bias))
            .collect();
        let clicks: f64 = rows.iter().map(|r| r.0).sum();
        bisect_bias(target, |b| {
            rows.iter().map(|(p, z)| p * sigmoid(z + b)).sum::<f64>() / clicks
        })
    }
}

/// The bias `b` in [-10, 10] where the increasing `mean(b)` reaches `target`.
fn bisect_bias(target: f64, mean: impl Fn(f64) -> f64) -> f64 {
    let (mut lo, mut hi) = (-10.0, 10.0);
    for _ in 0..50 {
        let b = 0.5 * (lo + hi);
        if mean(b) < target {
            lo = b;
        } else {
            hi = b;
        }
    }
    0.5 * (lo + hi)
}

const GENDERS: [&str; 3] = ["f", "m", "x"];

/// Writes `cfg.rows` lines of the rich profile to `out` and, with `oracle`, each row's true
/// click probability and true click-and-convert probability (`p_click \t p_ctcvr`, one line
/// per row). The same config always gives byte-identical output.
pub fn write_rich(
    cfg: &RichConfig,
    out: &mut dyn Write,
    mut oracle: Option<&mut dyn Write>,
) -> io::Result<()> {
    let model = Model::new(cfg.model_seed);
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut obuf: Vec<u8> = Vec::new();
    for i in 0..cfg.rows {
        let mut rng = Rng(hash3(cfg.seed, 0x71C4, i));
        let row = model.sample(&mut rng);
        let p = sigmoid(model.logit(&row));
        let label = u8::from(rng.unit() < p);
        let p_cvr = sigmoid(model.cvr_logit(&row));
        let conversion = label == 1 && Rng(hash3(cfg.seed, CONVERSION_DRAW, i)).unit() < p_cvr;
        write!(
            buf,
            "{label}\tu{}\t{}\ti{}\tc{}\t",
            row.user,
            GENDERS[model.gender(row.user) as usize],
            row.item,
            model.category(row.item)
        )?;
        for (k, (t, w)) in row.tags.iter().enumerate() {
            if k > 0 {
                buf.push(b'|');
            }
            write!(buf, "t{t}:{w:.2}")?;
        }
        buf.push(b'\t');
        for (k, h) in row.hist.iter().enumerate() {
            if k > 0 {
                buf.push(b'|');
            }
            write!(buf, "i{h}")?;
        }
        write!(
            buf,
            "\t{:.2}\t{}\t",
            model.price(row.item),
            u8::from(conversion)
        )?;
        for (k, h) in row.hist.iter().enumerate() {
            if k > 0 {
                buf.push(b'|');
            }
            write!(buf, "c{}", model.category(*h))?;
        }
        buf.push(b'\n');
        if oracle.is_some() {
            writeln!(obuf, "{p:.6}\t{:.6}", p * p_cvr)?;
        }
        if buf.len() >= (1 << 20) - 4096 {
            out.write_all(&buf)?;
            buf.clear();
            if let Some(o) = oracle.as_mut() {
                o.write_all(&obuf)?;
                obuf.clear();
            }
        }
    }
    out.write_all(&buf)?;
    out.flush()?;
    if let Some(o) = oracle {
        o.write_all(&obuf)?;
        o.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::{DenseInput, DenseTransform, InputPlan, Pooling, Slot, SlotKind};
    use crate::LineParser;

    fn gen(cfg: &RichConfig) -> (Vec<u8>, Vec<u8>) {
        let (mut v, mut o) = (Vec::new(), Vec::new());
        write_rich(cfg, &mut v, Some(&mut o)).unwrap();
        (v, o)
    }

    #[test]
    fn deterministic_and_seeded() {
        let cfg = RichConfig {
            rows: 1500,
            ..RichConfig::default()
        };
        let (a, oracle) = gen(&cfg);
        assert_eq!((a.clone(), oracle.clone()), gen(&cfg));
        assert_eq!(a.iter().filter(|&&b| b == b'\n').count(), 1500);
        assert_eq!(oracle.iter().filter(|&&b| b == b'\n').count(), 1500);
        let text = std::str::from_utf8(&a).unwrap();
        assert!(text.lines().all(|l| l.split('\t').count() == 10));
        let mut plain = Vec::new();
        write_rich(&cfg, &mut plain, None).unwrap();
        assert_eq!(plain, a, "the oracle does not change the data");
        let (b, _) = gen(&RichConfig {
            seed: 2,
            ..cfg.clone()
        });
        assert_ne!(a, b);
        let (short, _) = gen(&RichConfig {
            rows: 100,
            ..cfg.clone()
        });
        assert!(a.starts_with(&short));
    }

    /// The explicit plan of `examples/rich.toml`, by hand.
    fn plan() -> InputPlan {
        let slot = |name: &str, column, tag, kind| Slot {
            name: name.into(),
            column,
            tag,
            kind,
        };
        InputPlan {
            slots: vec![
                slot("user_id", 1, 0, SlotKind::Id),
                slot("gender", 2, 1, SlotKind::Id),
                slot("item_id", 3, 2, SlotKind::Id),
                slot("item_cat", 4, 3, SlotKind::Id),
                slot(
                    "tags",
                    5,
                    4,
                    SlotKind::Bag {
                        pooling: Pooling::Mean,
                        weighted: true,
                        weight_separator: b':',
                    },
                ),
                slot("hist_items", 6, 2, SlotKind::Sequence { max_len: 20 }),
                slot(
                    "price_bucket",
                    7,
                    5,
                    SlotKind::Buckets {
                        boundaries: vec![5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 70.0, 120.0],
                    },
                ),
            ],
            dense: vec![DenseInput {
                name: "price".into(),
                column: 7,
                transform: DenseTransform::Log1p,
            }],
        }
    }

    /// Both oracle columns of every line: `(p_click, p_ctcvr)`.
    fn oracle_probs(oracle: &[u8]) -> Vec<(f64, f64)> {
        std::str::from_utf8(oracle)
            .unwrap()
            .lines()
            .map(|l| {
                let (a, b) = l.split_once('\t').expect("p_click \\t p_ctcvr");
                (a.parse().unwrap(), b.parse().unwrap())
            })
            .collect()
    }

    /// Adding `conversion` and `hist_cats` changed nothing else: the first rows of the
    /// profile before them (`sparta gen-data --profile rich --seed 3`, its default model seed),
    /// their columns and click probabilities, verbatim.
    #[test]
    fn the_earlier_columns_are_unchanged() {
        let (text, oracle) = gen(&RichConfig {
            rows: 3,
            seed: 3,
            model_seed: 20261129,
        });
        let before = [
            "1\tu81327\tx\ti1577\tc89\tt0:0.38|t16:0.12|t30:0.94|t0:0.85|t164:0.94\ti4193|i32596|i949|i30717\t15.22",
            "1\tu102\tm\ti3886\tc0\tt17:0.83|t4:0.59|t24:0.05\ti905|i107|i6421|i3282|i45134|i23699|i30905|i46146|i1910|i1178|i5245|i7597|i10530|i107|i350|i5002|i179|i1441\t78.35",
            "1\tu59458\tx\ti8669\tc193\tt258:0.59|t28:0.88|t66:0.41|t85:0.95\ti4829|i5489|i15082|i2329|i572|i816|i324|i9451|i8374|i34867|i2910|i2680\t13.31",
        ];
        let lines: Vec<&str> = std::str::from_utf8(&text).unwrap().lines().collect();
        for (line, want) in lines.iter().zip(before) {
            let first8: Vec<&str> = line.split('\t').take(8).collect();
            assert_eq!(first8.join("\t"), want);
        }
        let p: Vec<String> = oracle_probs(&oracle)
            .iter()
            .map(|p| format!("{:.6}", p.0))
            .collect();
        assert_eq!(p, ["0.388400", "0.207857", "0.296999"]);
    }

    /// Conversions: only on clicks, ~25% of them (~5% of rows), the oracle's CTCVR matches,
    /// cheaper items convert more; `hist_cats` are the categories of `hist_items`.
    #[test]
    fn conversions_follow_clicks_and_hist_cats_follow_the_history() {
        let cfg = RichConfig {
            rows: 40_000,
            seed: 11,
            ..RichConfig::default()
        };
        let (text, oracle) = gen(&cfg);
        let model = Model::new(cfg.model_seed);
        let (mut clicks, mut conversions) = (0u32, 0u32);
        // clicked rows below / above the median price (~20): (conversions, clicks)
        let (mut cheap, mut dear) = ((0u32, 0u32), (0u32, 0u32));
        for line in std::str::from_utf8(&text).unwrap().lines() {
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(cols.len(), 10, "{line}");
            let (click, conv) = (cols[0] == "1", cols[8] == "1");
            assert!(["0", "1"].contains(&cols[8]), "{line}");
            assert!(click || !conv, "a conversion without a click: {line}");
            clicks += u32::from(click);
            conversions += u32::from(conv);
            if click {
                let price: f64 = cols[7].parse().unwrap();
                let n = if price < 20.0 { &mut cheap } else { &mut dear };
                n.0 += u32::from(conv);
                n.1 += 1;
            }
            let want: Vec<String> = cols[6]
                .split('|')
                .filter(|h| !h.is_empty())
                .map(|h| format!("c{}", model.category(h[1..].parse().unwrap())))
                .collect();
            assert_eq!(cols[9], want.join("|"), "{line}");
        }
        let rows = cfg.rows as f64;
        let (rate, cvr) = (
            conversions as f64 / rows,
            conversions as f64 / clicks as f64,
        );
        let (cheap_cvr, dear_cvr) = (
            cheap.0 as f64 / cheap.1 as f64,
            dear.0 as f64 / dear.1 as f64,
        );
        let probs = oracle_probs(&oracle);
        let mean_ctcvr = probs.iter().map(|p| p.1).sum::<f64>() / rows;
        eprintln!(
            "conversion rate {rate:.4}, P(conv | click) {cvr:.3}, oracle CTCVR {mean_ctcvr:.4}, \
             P(conv | click) cheap {cheap_cvr:.3} dear {dear_cvr:.3}"
        );
        assert!((0.04..0.06).contains(&rate), "conversion rate {rate}");
        assert!((0.21..0.29).contains(&cvr), "P(conversion | click) {cvr}");
        assert!((rate - mean_ctcvr).abs() < 0.006, "{rate} vs {mean_ctcvr}");
        assert!(probs.iter().all(|&(p, q)| (0.0..=p).contains(&q)));
        assert!(
            cheap_cvr > dear_cvr + 0.05,
            "cheap {cheap_cvr}, dear {dear_cvr}"
        );
    }

    #[test]
    fn lines_parse_with_the_explicit_plan() {
        let (text, oracle) = gen(&RichConfig {
            rows: 2000,
            seed: 5,
            ..RichConfig::default()
        });
        let schema = rich_schema();
        schema.validate().unwrap();
        let plan = plan();
        plan.validate(&schema).unwrap();
        let p = LineParser::with_plan(&schema, &plan);
        let mut b = p.builder(2000);
        for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            p.parse_line(line, &mut b).unwrap();
        }
        let b = b.take();
        b.check_tags(&[0, 1, 2, 3, 4, 2, 5]).unwrap();
        assert_eq!(b.rows, 2000);
        assert_eq!(b.num_labels, 2, "label and conversion");
        assert!(b.weights.iter().all(|&w| (0.01..=1.0).contains(&w)));
        assert!(!b.has_sample_weights());
        let converted = b.label_values(1).filter(|&c| c > 0.5).count();
        assert!(converted > 0 && converted < b.positives());
        let probs: Vec<f64> = oracle_probs(&oracle).iter().map(|p| p.0).collect();
        assert!(probs.iter().all(|p| (0.0..=1.0).contains(p)));
        let rate = b.positives() as f64 / b.rows as f64;
        assert!((0.15..0.25).contains(&rate), "click rate {rate}");
        let mean_p = probs.iter().sum::<f64>() / probs.len() as f64;
        eprintln!("click rate {rate:.3}, mean oracle probability {mean_p:.3}");
        assert!(
            (rate - mean_p).abs() < 0.03,
            "rate {rate} vs oracle {mean_p}"
        );
    }

    /// The hidden bonus shows in the data: rows whose target category appears among the
    /// history's categories (read back from the text) click clearly more often.
    #[test]
    fn category_in_history_bonus_is_visible() {
        let (text, _) = gen(&RichConfig {
            rows: 20_000,
            seed: 9,
            ..RichConfig::default()
        });
        let model = Model::new(RichConfig::default().model_seed);
        let (mut with, mut without) = ((0u32, 0u32), (0u32, 0u32));
        for line in std::str::from_utf8(&text).unwrap().lines() {
            let cols: Vec<&str> = line.split('\t').collect();
            let cat = cols[4];
            let hit = cols[6]
                .split('|')
                .filter(|h| !h.is_empty())
                .any(|h| format!("c{}", model.category(h[1..].parse().unwrap())) == cat);
            let n = if hit { &mut with } else { &mut without };
            n.0 += u32::from(cols[0] == "1");
            n.1 += 1;
        }
        assert!(with.1 > 2000 && without.1 > 2000, "{with:?} {without:?}");
        let (a, b) = (
            with.0 as f64 / with.1 as f64,
            without.0 as f64 / without.1 as f64,
        );
        eprintln!(
            "CTR with the category in the history {a:.3} ({} rows), without {b:.3} ({} rows)",
            with.1, without.1
        );
        assert!(
            a > b + 0.1,
            "CTR with the category in the history {a}, without {b}"
        );
    }

    /// `examples/rich.toml` documents this layout.
    #[test]
    fn the_example_job_documents_the_schema() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/rich.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let job: toml::Value = toml::from_str(&text).unwrap();
        let schema: Schema = job["data"]["schema"].clone().try_into().unwrap();
        assert_eq!(schema, rich_schema());
        assert_eq!(job["data"]["format"].as_str(), Some("custom"));
    }
}

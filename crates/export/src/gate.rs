//! The quality gate of exports (`[export] gate`): a version whose window metrics are worse
//! than the best of the recently published versions by more than the allowed margin is held
//! back (never published), so `sparta serve` keeps the last good version.
//!
//! Rules, per task (every task is judged: a multi-task model is held back when any task
//! regressed; tasks are matched by name):
//! * a task whose window holds fewer than `min_rows` rows is not judged (and not used as a
//!   reference): a short window's AUC is noise;
//! * the references are the last `history` published versions that carry quality; the best
//!   AUC (highest) and the best logloss (lowest) among them are taken separately;
//! * held back when `best_auc - auc > max_auc_drop` or `logloss - best_logloss >
//!   max_logloss_rise`; an undefined metric (`None`: an AUC over one class) is not judged;
//! * a version without quality (no progressive metrics in the run) or without references (the
//!   first of a run) is published.
//!
//! Held-back versions never enter the references, so a run of bad versions is compared with
//! the good one before it. The references live in memory: a restarted trainer starts with
//! none (its first version is published unjudged).

use std::collections::VecDeque;

use crate::quality::ExportQuality;

/// Published versions remembered as references by default.
pub const DEFAULT_HISTORY: usize = 5;

/// When a version is held back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GateRule {
    /// Largest allowed AUC drop below the best reference (`None`: AUC not judged).
    pub max_auc_drop: Option<f64>,
    /// Largest allowed logloss rise above the best reference (`None`: logloss not judged).
    pub max_logloss_rise: Option<f64>,
    /// Window rows a task needs before it is judged or used as a reference.
    pub min_rows: u64,
    /// Published versions used as references (the newest ones).
    pub history: usize,
}

impl From<&sparta_core::config::ExportGate> for GateRule {
    fn from(g: &sparta_core::config::ExportGate) -> Self {
        GateRule {
            max_auc_drop: g.max_auc_drop,
            max_logloss_rise: g.max_logloss_rise,
            min_rows: g.min_rows,
            history: g.history,
        }
    }
}

/// The metric a regression was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// AUC (higher is better).
    Auc,
    /// Log loss (lower is better).
    Logloss,
}

/// One task's metric worse than the references allow.
#[derive(Clone, Debug, PartialEq)]
pub struct Regression {
    /// The task.
    pub task: String,
    /// The metric.
    pub metric: Metric,
    /// The candidate's value.
    pub value: f64,
    /// The best reference value.
    pub best: f64,
    /// The allowed margin.
    pub limit: f64,
}

impl std::fmt::Display for Regression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, change) = match self.metric {
            Metric::Auc => ("AUC", "drop"),
            Metric::Logloss => ("logloss", "rise"),
        };
        write!(
            f,
            "task `{}`: window {name} {:.5} vs best recent {:.5} ({change} {:.5} > {:.5})",
            self.task,
            self.value,
            self.best,
            (self.value - self.best).abs(),
            self.limit
        )
    }
}

/// Why a version may be published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// It carries no quality (no progressive metrics in this run).
    NoQuality,
    /// No task's window reached `min_rows`.
    TooFewRows,
    /// No published version to compare with yet.
    NoReference,
    /// Every judged metric is within the margins.
    Within,
}

/// The gate's decision on one version.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Publish it.
    Publish(Pass),
    /// Hold it back: every regression found.
    HoldBack(Vec<Regression>),
}

/// Judges `candidate` against the published `references` (the newest last) by `rule`.
pub fn judge<'a>(
    rule: &GateRule,
    references: impl IntoIterator<Item = &'a ExportQuality> + Clone,
    candidate: Option<&ExportQuality>,
) -> Verdict {
    let Some(c) = candidate else {
        return Verdict::Publish(Pass::NoQuality);
    };
    let mut judged = false;
    let mut compared = false;
    let mut out = Vec::new();
    for t in c.tasks.iter().filter(|t| t.rows >= rule.min_rows) {
        judged = true;
        let refs = references
            .clone()
            .into_iter()
            .filter_map(|r| r.task(&t.task))
            .filter(|r| r.rows >= rule.min_rows);
        let (mut best_auc, mut best_ll): (Option<f64>, Option<f64>) = (None, None);
        for r in refs {
            compared = true;
            if let Some(a) = r.auc {
                best_auc = Some(best_auc.map_or(a, |b| b.max(a)));
            }
            if let Some(l) = r.logloss {
                best_ll = Some(best_ll.map_or(l, |b| b.min(l)));
            }
        }
        if let (Some(limit), Some(value), Some(best)) = (rule.max_auc_drop, t.auc, best_auc) {
            if best - value > limit {
                out.push(Regression {
                    task: t.task.clone(),
                    metric: Metric::Auc,
                    value,
                    best,
                    limit,
                });
            }
        }
        if let (Some(limit), Some(value), Some(best)) = (rule.max_logloss_rise, t.logloss, best_ll)
        {
            if value - best > limit {
                out.push(Regression {
                    task: t.task.clone(),
                    metric: Metric::Logloss,
                    value,
                    best,
                    limit,
                });
            }
        }
    }
    if !out.is_empty() {
        Verdict::HoldBack(out)
    } else if !judged {
        Verdict::Publish(Pass::TooFewRows)
    } else if !compared {
        Verdict::Publish(Pass::NoReference)
    } else {
        Verdict::Publish(Pass::Within)
    }
}

/// The gate of one exporting run: the rule and the quality of its last published versions.
#[derive(Clone, Debug)]
pub struct Gate {
    rule: GateRule,
    published: VecDeque<ExportQuality>,
    /// Warned once that there are no metrics to judge.
    warned_unjudged: bool,
}

impl Gate {
    /// A gate with no references yet.
    pub fn new(rule: GateRule) -> Gate {
        Gate {
            rule,
            published: VecDeque::new(),
            warned_unjudged: false,
        }
    }

    /// [`Gate::judge`] for the version due after `step`, with what the trainer logs: a
    /// warning naming the regressions when it is held back (`what`: the kind of export,
    /// `last_published`: the version served meanwhile), and once per run a warning when
    /// there are no progressive metrics to judge. True: hold it back.
    pub fn holds_back(
        &mut self,
        candidate: Option<&ExportQuality>,
        what: &str,
        step: u64,
        last_published: Option<u64>,
    ) -> bool {
        match self.judge(candidate) {
            Verdict::HoldBack(regressions) => {
                let why: Vec<String> = regressions.iter().map(|r| r.to_string()).collect();
                tracing::warn!(
                    "{what} at step {step} held back by the quality gate (the served model \
                     stays at the last published version {}): {}",
                    last_published.map_or("(none in this run)".to_string(), |v| format!("v{v}")),
                    why.join("; ")
                );
                true
            }
            Verdict::Publish(Pass::NoQuality) => {
                if !std::mem::replace(&mut self.warned_unjudged, true) {
                    tracing::warn!(
                        "[export] gate: no progressive metrics to judge ({what}s are published \
                         unjudged; see [metrics] progressive)"
                    );
                }
                false
            }
            Verdict::Publish(_) => false,
        }
    }

    /// The rule.
    pub fn rule(&self) -> &GateRule {
        &self.rule
    }

    /// Judges a version about to be exported.
    pub fn judge(&self, candidate: Option<&ExportQuality>) -> Verdict {
        judge(&self.rule, &self.published, candidate)
    }

    /// Records a published version: its quality becomes a reference (the oldest beyond
    /// `history` is forgotten). A version without quality changes nothing.
    pub fn published(&mut self, quality: Option<&ExportQuality>) {
        let Some(q) = quality else {
            return;
        };
        self.published.push_back(q.clone());
        while self.published.len() > self.rule.history.max(1) {
            self.published.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quality::TaskQuality;

    fn rule() -> GateRule {
        GateRule {
            max_auc_drop: Some(0.01),
            max_logloss_rise: Some(0.02),
            min_rows: 1000,
            history: 3,
        }
    }

    fn q(tasks: &[(&str, Option<f64>, Option<f64>, u64)]) -> ExportQuality {
        ExportQuality {
            window: 10_000,
            step: 1,
            tasks: tasks
                .iter()
                .map(|&(task, auc, logloss, rows)| TaskQuality {
                    task: task.into(),
                    auc,
                    logloss,
                    calibration: Some(1.0),
                    rows,
                })
                .collect(),
        }
    }

    fn one(auc: f64, logloss: f64) -> ExportQuality {
        q(&[("ctr", Some(auc), Some(logloss), 5000)])
    }

    fn held(v: &Verdict) -> Vec<Metric> {
        match v {
            Verdict::HoldBack(r) => r.iter().map(|r| r.metric).collect(),
            Verdict::Publish(_) => Vec::new(),
        }
    }

    #[test]
    fn the_first_version_and_one_without_quality_are_published() {
        let g = Gate::new(rule());
        assert_eq!(g.judge(None), Verdict::Publish(Pass::NoQuality));
        assert_eq!(
            g.judge(Some(&one(0.5, 0.9))),
            Verdict::Publish(Pass::NoReference)
        );
    }

    #[test]
    fn an_auc_drop_beyond_the_margin_is_held_back_and_within_it_published() {
        let mut g = Gate::new(rule());
        g.published(Some(&one(0.75, 0.45)));
        assert_eq!(
            g.judge(Some(&one(0.745, 0.45))),
            Verdict::Publish(Pass::Within)
        );
        let v = g.judge(Some(&one(0.73, 0.45)));
        assert_eq!(held(&v), vec![Metric::Auc]);
        let Verdict::HoldBack(r) = v else {
            unreachable!()
        };
        assert_eq!((r[0].value, r[0].best, r[0].limit), (0.73, 0.75, 0.01));
        let text = r[0].to_string();
        assert!(
            text.contains("ctr") && text.contains("AUC 0.73000"),
            "{text}"
        );
    }

    #[test]
    fn a_logloss_rise_beyond_the_margin_is_held_back() {
        let mut g = Gate::new(rule());
        g.published(Some(&one(0.75, 0.45)));
        assert_eq!(held(&g.judge(Some(&one(0.75, 0.47)))), Vec::<Metric>::new());
        assert_eq!(
            held(&g.judge(Some(&one(0.75, 0.48)))),
            vec![Metric::Logloss]
        );
        assert_eq!(
            held(&g.judge(Some(&one(0.70, 0.60)))),
            vec![Metric::Auc, Metric::Logloss]
        );
    }

    #[test]
    fn the_best_of_the_last_history_versions_is_the_reference() {
        let mut g = Gate::new(rule());
        g.published(Some(&one(0.80, 0.40)));
        for _ in 0..3 {
            g.published(Some(&one(0.75, 0.45)));
        }
        // 0.80 / 0.40 left the last 3: 0.745 is within 0.01 of 0.75.
        assert_eq!(
            g.judge(Some(&one(0.745, 0.46))),
            Verdict::Publish(Pass::Within)
        );
        g.published(Some(&one(0.78, 0.50)));
        // The best AUC (0.78) and the best logloss (0.45) come from different versions.
        assert_eq!(held(&g.judge(Some(&one(0.765, 0.46)))), vec![Metric::Auc]);
        assert_eq!(
            held(&g.judge(Some(&one(0.78, 0.48)))),
            vec![Metric::Logloss]
        );
    }

    #[test]
    fn short_windows_are_neither_judged_nor_references() {
        let mut g = Gate::new(rule());
        assert_eq!(
            g.judge(Some(&q(&[("ctr", Some(0.5), Some(0.9), 999)]))),
            Verdict::Publish(Pass::TooFewRows)
        );
        g.published(Some(&q(&[("ctr", Some(0.9), Some(0.1), 10)])));
        assert_eq!(
            g.judge(Some(&one(0.6, 0.6))),
            Verdict::Publish(Pass::NoReference)
        );
        g.published(Some(&one(0.75, 0.45)));
        assert_eq!(
            g.judge(Some(&q(&[("ctr", Some(0.5), Some(0.9), 999)]))),
            Verdict::Publish(Pass::TooFewRows)
        );
    }

    #[test]
    fn undefined_metrics_are_not_judged() {
        let mut g = Gate::new(rule());
        g.published(Some(&q(&[("ctr", None, Some(0.45), 5000)])));
        // No reference AUC: only logloss is judged.
        assert_eq!(
            g.judge(Some(&one(0.1, 0.45))),
            Verdict::Publish(Pass::Within)
        );
        g.published(Some(&one(0.75, 0.45)));
        assert_eq!(
            g.judge(Some(&q(&[("ctr", None, Some(0.45), 5000)]))),
            Verdict::Publish(Pass::Within)
        );
    }

    #[test]
    fn every_task_is_judged_by_name() {
        let mut g = Gate::new(rule());
        g.published(Some(&q(&[
            ("ctr", Some(0.75), Some(0.45), 5000),
            ("ctcvr", Some(0.80), Some(0.05), 5000),
        ])));
        let v = g.judge(Some(&q(&[
            ("ctcvr", Some(0.70), Some(0.05), 5000),
            ("ctr", Some(0.75), Some(0.45), 5000),
        ])));
        let Verdict::HoldBack(r) = v else {
            panic!("held back expected: {v:?}")
        };
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].task.as_str(), r[0].metric), ("ctcvr", Metric::Auc));
    }

    #[test]
    fn a_metric_without_a_margin_is_not_judged() {
        let mut g = Gate::new(GateRule {
            max_auc_drop: None,
            ..rule()
        });
        g.published(Some(&one(0.75, 0.45)));
        assert_eq!(
            g.judge(Some(&one(0.5, 0.45))),
            Verdict::Publish(Pass::Within)
        );
    }
}

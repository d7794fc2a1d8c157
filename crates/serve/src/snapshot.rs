//! A loaded export: the job, the dense model and the tables' weights in hash maps, at one
//! version. Requests score against an `Arc<Snapshot>`, so a request sees one version from
//! start to end; [`crate::reload::ModelHandle`] swaps whole snapshots.
//!
//! Scoring reuses the trainer's code (`sparta-core`): [`Tables`] implements the worker's
//! `SparseStore` (an absent id reads as zeros, exactly as the trainer's
//! `Table::pull_readonly` does in evaluation), [`sparta_core::step::lookup`] dedups the
//! ids, pulls and sum-pools them, and [`Model::predict`] runs the dense network. Served,
//! offline (`sparta predict`) and the trainer's own scores are the same computation.

use std::time::SystemTime;

use parking_lot::Mutex;
use sparta_core::dedup::Deduper;
use sparta_core::features::Features;
use sparta_core::step::{self, Lookup};
use sparta_core::{Job, JobConfig, SparseStore};
use sparta_data::Batch;
use sparta_nn::{Model, ModelConfig};

use crate::error::ServeError;
use crate::request::RequestParser;
use crate::tables::Tables;
use sparta_export::format::{ExportKind, ExportVersion};

/// Most idle scorers (dense model + scratch buffers) kept per snapshot.
const MAX_IDLE_SCORERS: usize = 64;

/// A dense model with the scratch space of one scoring call.
struct Scorer {
    model: Model,
    deduper: Deduper,
    lookup: Lookup,
    out: Vec<f32>,
}

impl Scorer {
    fn new(cfg: &ModelConfig, dense: &[f32]) -> Result<Scorer, ServeError> {
        let mut model = Model::new(cfg.clone())?;
        if model.param_values().len() != dense.len() {
            return Err(ServeError::Usage(format!(
                "the export has {} dense parameters, its job config builds a model of {}",
                dense.len(),
                model.param_values().len()
            )));
        }
        model.param_values_mut().copy_from_slice(dense);
        Ok(Scorer {
            model,
            deduper: Deduper::new(),
            lookup: Lookup::default(),
            out: Vec::new(),
        })
    }

    fn score(&mut self, tables: &Tables, features: &Features, batch: Batch) -> Vec<f32> {
        step::lookup(
            tables,
            &mut self.deduper,
            features,
            batch,
            &mut self.lookup,
            false,
        )
        .expect("snapshot tables answer every pull");
        step::predict(&mut self.model, features, &self.lookup, &mut self.out);
        self.out.clone()
    }
}

/// One version of an export, loaded and ready to score.
pub struct Snapshot {
    job: Job,
    job_text: String,
    model_cfg: ModelConfig,
    requests: RequestParser,
    version: u64,
    full_version: u64,
    step: u64,
    lineage: u64,
    created_unix_ms: u64,
    loaded_at: SystemTime,
    tables: Tables,
    dense: Vec<f32>,
    scorers: Mutex<Vec<Scorer>>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("version", &self.version)
            .field("step", &self.step)
            .field("rows", &self.tables.table_rows())
            .finish()
    }
}

impl Clone for Snapshot {
    /// A deep copy of the weights (the scorer pool starts empty).
    fn clone(&self) -> Self {
        Snapshot {
            job: self.job.clone(),
            job_text: self.job_text.clone(),
            model_cfg: self.model_cfg.clone(),
            requests: self.requests.clone(),
            version: self.version,
            full_version: self.full_version,
            step: self.step,
            lineage: self.lineage,
            created_unix_ms: self.created_unix_ms,
            loaded_at: self.loaded_at,
            tables: self.tables.clone(),
            dense: self.dense.clone(),
            scorers: Mutex::new(Vec::new()),
        }
    }
}

impl Snapshot {
    /// Builds a snapshot from a full export version.
    pub fn from_full(full: &ExportVersion) -> Result<Snapshot, ServeError> {
        let m = &full.manifest;
        if m.kind != ExportKind::Full {
            return Err(ServeError::invalid(m.version, "not a full export"));
        }
        let job = JobConfig::from_toml(&m.job_config)?.validate()?;
        let mut model_cfg = job.model.clone();
        model_cfg.threads = 1;
        let first = Scorer::new(&model_cfg, &full.dense)?;
        let mut physical = Vec::with_capacity(job.features.physical.len());
        for p in &job.features.physical {
            let name = &p.config.name;
            let t = full
                .tables
                .iter()
                .find(|t| t.name == *name)
                .ok_or_else(|| ServeError::invalid(m.version, format!("no `{name}` table")))?;
            if t.dim != p.config.dim {
                return Err(ServeError::invalid(
                    m.version,
                    format!(
                        "table `{name}` has dim {}, the job's is {}",
                        t.dim, p.config.dim
                    ),
                ));
            }
            // Rows stay in the export's stored form (a compact table's compact bytes).
            physical.push((name.clone(), t.dim, t.dtype));
        }
        let mut tables = Tables::new(physical);
        for t in &full.tables {
            if let Some(map) = tables.get_mut(&t.name) {
                map.apply(t)
                    .map_err(|e| ServeError::invalid(m.version, e))?;
            }
        }
        Ok(Snapshot {
            requests: RequestParser::new(&job.schema, &job.features.plan),
            job,
            job_text: m.job_config.clone(),
            model_cfg,
            version: m.version,
            full_version: m.version,
            step: m.step,
            lineage: m.lineage,
            created_unix_ms: m.created_unix_ms,
            loaded_at: SystemTime::now(),
            tables,
            dense: full.dense.clone(),
            scorers: Mutex::new(vec![first]),
        })
    }

    /// Applies a delta version in place (it must follow this snapshot's version). On error
    /// the snapshot may be half-updated: callers drop it.
    pub fn apply_in_place(&mut self, d: &ExportVersion) -> Result<(), ServeError> {
        let m = &d.manifest;
        if m.kind != ExportKind::Delta || m.base != Some(self.version) {
            return Err(ServeError::invalid(
                m.version,
                format!(
                    "{:?} export with base {:?} does not follow the loaded version {}",
                    m.kind, m.base, self.version
                ),
            ));
        }
        if d.dense.len() != self.dense.len() {
            return Err(ServeError::invalid(
                m.version,
                "dense parameter count changed",
            ));
        }
        for t in &d.tables {
            let form = self
                .tables
                .get_mut(&t.name)
                .map(|map| (map.dim(), map.dtype()));
            if form.is_some_and(|form| form != (t.dim, t.dtype)) {
                return Err(ServeError::invalid(
                    m.version,
                    format!("table `{}` changed its dim or dtype", t.name),
                ));
            }
        }
        for t in &d.tables {
            if let Some(map) = self.tables.get_mut(&t.name) {
                map.apply(t)
                    .map_err(|e| ServeError::invalid(m.version, e))?;
            }
        }
        self.dense.copy_from_slice(&d.dense);
        for sc in self.scorers.get_mut().iter_mut() {
            sc.model.param_values_mut().copy_from_slice(&d.dense);
        }
        self.version = m.version;
        self.step = m.step;
        self.lineage = m.lineage;
        self.created_unix_ms = m.created_unix_ms;
        self.loaded_at = SystemTime::now();
        Ok(())
    }

    /// A copy of this snapshot with delta `d` applied (this one is untouched and keeps
    /// serving). Costs a copy of every table; [`crate::reload::ModelHandle`] avoids it in
    /// steady state.
    pub fn apply_delta(&self, d: &ExportVersion) -> Result<Snapshot, ServeError> {
        let mut next = self.clone();
        next.apply_in_place(d)?;
        Ok(next)
    }

    /// Scores a batch: one probability per row and task (`rows * tasks`, row-major).
    pub fn predict(&self, batch: Batch) -> Vec<f32> {
        if batch.rows == 0 {
            return Vec::new();
        }
        let popped = self.scorers.lock().pop();
        let mut sc = match popped {
            Some(s) => s,
            None => Scorer::new(&self.model_cfg, &self.dense)
                .expect("the model config and dense size were checked at load"),
        };
        let probs = sc.score(&self.tables, &self.job.features, batch);
        let mut pool = self.scorers.lock();
        if pool.len() < MAX_IDLE_SCORERS {
            pool.push(sc);
        }
        probs
    }

    /// The model's task names: [`Snapshot::predict`] gives one probability per task per row.
    pub fn task_names(&self) -> Vec<String> {
        self.model_cfg.task_names()
    }

    /// The validated job of the export.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The job config text of the export.
    pub fn job_text(&self) -> &str {
        &self.job_text
    }

    /// The parser of requests (JSON rows, lines) for the export's schema.
    pub fn requests(&self) -> &RequestParser {
        &self.requests
    }

    /// The export version loaded.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The full export the loaded chain starts at.
    pub fn full_version(&self) -> u64 {
        self.full_version
    }

    /// The lineage of the exporting trainer run of the loaded version (0: unknown, layout 1).
    pub fn lineage(&self) -> u64 {
        self.lineage
    }

    /// Training step of the loaded version.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// When the loaded version was exported (ms since the Unix epoch).
    pub fn created_unix_ms(&self) -> u64 {
        self.created_unix_ms
    }

    /// When this snapshot reached its version.
    pub fn loaded_at(&self) -> SystemTime {
        self.loaded_at
    }

    /// The tables.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// Dense parameters.
    pub fn dense(&self) -> &[f32] {
        &self.dense
    }
}

//! The coordinator of a replicated PS cluster (`sparta coordinator`): it watches every PS
//! process (a `Roles` call every interval), declares a process dead once it stayed silent
//! for `dead_after` (or came back as another incarnation: its state is gone), promotes a
//! backup of every shard whose primary died under a new epoch, takes dead backups out of
//! their shards, and tells every copy the role it must have (`Reconfigure`) until it has
//! it. Workers ask it where each shard's primary is (`Route`).
//!
//! [`Membership`] is the decision core: no I/O, driven by what the loop heard.
//!
//! Why a coordinator of ours and not a consensus crate: the decisions need one writer, and
//! safety does not rest on it. A primary answers a push only once every backup applied it,
//! and a backup refuses a primary of an older epoch, so a primary cut off from the
//! coordinator cannot acknowledge anything once its backup was promoted: fencing by epoch
//! holds with a single coordinator, and a dead coordinator only delays failover (training
//! goes on). A Raft group would make the coordinator itself replicated; not built.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use crate::error::{PsError, Refusal};
use crate::replica::{peer_client, PeerClient, Placement};
use sparta_proto::pb::coordinator_server::{Coordinator, CoordinatorServer};
use sparta_proto::pb::{self as pb, Role};
use sparta_proto::status::{classify, Cause};

/// Where the copies of one shard are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    /// Raised at every change of the shard's copies.
    pub epoch: u64,
    /// The primary's process (`None`: every copy died; only a rollback restores the shard).
    pub primary: Option<usize>,
    /// The backups' processes, in promotion order.
    pub backups: Vec<usize>,
    /// A copy receiving its copy of the primary (rejoining), not yet a backup, and the
    /// epoch its join started.
    pub joining: Option<(usize, u64)>,
}

/// What one copy must be: role, epoch, and for a primary its backups and joining copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// The copy's role.
    pub role: Role,
    /// The shard's epoch.
    pub epoch: u64,
    /// A primary's backups.
    pub backups: Vec<usize>,
    /// A primary's joining copies.
    pub joining: Vec<usize>,
    /// The epoch their join started.
    pub join_epoch: u64,
}

#[derive(Clone, Debug, Default)]
struct ProcState {
    /// The incarnation first heard (0: never heard).
    incarnation: u64,
    /// Since when it has not answered.
    silent_since: Option<Instant>,
    dead: bool,
}

/// The coordinator's view and decisions (no I/O).
#[derive(Debug)]
pub struct Membership {
    shards: Vec<ShardMap>,
    procs: Vec<ProcState>,
    dead_after: Duration,
    placement: Placement,
    failovers: u64,
    dropped: u64,
    rejoins: u64,
}

impl Membership {
    /// Shard `s`'s primary on process `s`, its backups on the next `replicas - 1` processes
    /// (as every PS places them), all at epoch 1.
    pub fn new(processes: usize, replicas: usize, dead_after: Duration) -> Result<Self, Refusal> {
        Self::with_base(processes, replicas, processes, dead_after)
    }

    /// [`Membership::new`] of a cluster that started with `base` shards (the others were
    /// added while it trained, see [`Placement::with_base`]).
    pub fn with_base(
        processes: usize,
        replicas: usize,
        base: usize,
        dead_after: Duration,
    ) -> Result<Self, Refusal> {
        let placement = Placement::with_base(replicas, processes, base)?;
        Ok(Self {
            shards: (0..processes)
                .map(|s| ShardMap {
                    epoch: 1,
                    primary: Some(s),
                    backups: placement.backups_of(s),
                    joining: None,
                })
                .collect(),
            procs: vec![ProcState::default(); processes],
            dead_after,
            placement,
            failovers: 0,
            dropped: 0,
            rejoins: 0,
        })
    }

    /// Process `p` answered, as incarnation `incarnation`. Another incarnation than the first
    /// heard is a restarted process: the one before it is dead now. A process heard again
    /// is alive; its copies that were taken out stay out until they rejoin.
    pub fn heard(&mut self, p: usize, incarnation: u64) -> Vec<String> {
        let st = &mut self.procs[p];
        st.silent_since = None;
        if st.incarnation == 0 {
            st.incarnation = incarnation;
            return Vec::new();
        }
        let mut events = Vec::new();
        if st.incarnation != incarnation {
            events.push(format!(
                "PS process {p} restarted (incarnation {:#x} -> {incarnation:#x}): its copies' \
                 state is gone",
                st.incarnation
            ));
            st.incarnation = incarnation;
            if !st.dead {
                events.extend(self.fail(p));
            }
        }
        if self.procs[p].dead {
            self.procs[p].dead = false;
            events.push(format!("PS process {p} answers again"));
        }
        events
    }

    /// Starts a rejoin on every shard short of backups whose primary lives: a live process
    /// holding a copy of it (by placement) outside the shard receives a fresh copy.
    pub fn plan_joins(&mut self) -> Vec<String> {
        let mut events = Vec::new();
        let want = self.placement.replicas - 1;
        for (s, m) in self.shards.iter_mut().enumerate() {
            let Some(q) = m.primary else { continue };
            if m.joining.is_some() || m.backups.len() >= want {
                continue;
            }
            let candidate = std::iter::once(s)
                .chain(self.placement.backups_of(s))
                .find(|&p| {
                    p != q
                        && !m.backups.contains(&p)
                        && !self.procs[p].dead
                        && self.procs[p].incarnation != 0
                });
            if let Some(p) = candidate {
                m.epoch += 1;
                m.joining = Some((p, m.epoch));
                events.push(format!(
                    "shard {s}: process {p} rejoins as a backup of process {q} (epoch {})",
                    m.epoch
                ));
            }
        }
        events
    }

    /// Primary `q` of `shard`, at `epoch`, says which backups hold every change it made: a
    /// joining copy among them is a backup now, once the primary is at the join's epoch
    /// (before, an older link to the same process may be what it reports).
    pub fn reported(
        &mut self,
        q: usize,
        shard: usize,
        epoch: u64,
        in_sync: &[usize],
    ) -> Vec<String> {
        let m = &mut self.shards[shard];
        match m.joining {
            Some((p, since)) if m.primary == Some(q) && epoch >= since && in_sync.contains(&p) => {
                m.joining = None;
                m.backups.push(p);
                m.epoch += 1;
                self.rejoins += 1;
                vec![format!(
                    "shard {shard}: process {p} caught up: a backup again (epoch {})",
                    m.epoch
                )]
            }
            _ => Vec::new(),
        }
    }

    /// Process `p` did not answer at `now`; returns what was decided.
    pub fn missed(&mut self, p: usize, now: Instant) -> Vec<String> {
        let st = &mut self.procs[p];
        if st.incarnation == 0 || st.dead {
            // Never heard (still starting) or already handled.
            return Vec::new();
        }
        let since = *st.silent_since.get_or_insert(now);
        if now.duration_since(since) < self.dead_after {
            return Vec::new();
        }
        let mut events = vec![format!(
            "PS process {p} silent for {:.1} s: dead",
            now.duration_since(since).as_secs_f64()
        )];
        events.extend(self.fail(p));
        events
    }

    /// Takes dead process `p` out of every shard: promotes a live backup where it was the
    /// primary (other backups are dropped too: they follow the old primary's numbering),
    /// removes it where it was a backup.
    fn fail(&mut self, p: usize) -> Vec<String> {
        self.procs[p].dead = true;
        let mut events = Vec::new();
        for (s, m) in self.shards.iter_mut().enumerate() {
            if m.joining.is_some_and(|(j, _)| j == p) {
                m.joining = None;
                m.epoch += 1;
                events.push(format!(
                    "shard {s}: the copy joining on process {p} is lost"
                ));
            }
            if m.primary == Some(p) {
                m.epoch += 1;
                let next = m.backups.iter().copied().find(|&b| !self.procs[b].dead);
                m.primary = next;
                m.backups.clear();
                // A copy still joining followed the old primary: it starts over.
                m.joining = None;
                match next {
                    Some(b) => {
                        self.failovers += 1;
                        events.push(format!(
                            "shard {s}: primary on process {p} lost; the backup on process {b} \
                             is its primary at epoch {}",
                            m.epoch
                        ));
                    }
                    None => events.push(format!(
                        "shard {s}: every copy is lost; only a rollback to the last \
                         checkpoint restores it"
                    )),
                }
            } else if m.backups.contains(&p) {
                m.epoch += 1;
                m.backups.retain(|&b| b != p);
                self.dropped += 1;
                events.push(format!(
                    "shard {s}: the backup on process {p} is taken out (epoch {})",
                    m.epoch
                ));
            }
        }
        events
    }

    /// What process `p`'s copy of `shard` must be.
    pub fn desired(&self, p: usize, shard: usize) -> Desired {
        let m = &self.shards[shard];
        let live = !self.procs[p].dead;
        let (role, backups, joining) = if m.primary == Some(p) && live {
            let joining = m.joining.map(|(j, _)| j).into_iter().collect();
            (Role::Primary, m.backups.clone(), joining)
        } else if m.backups.contains(&p) && live {
            (Role::Backup, Vec::new(), Vec::new())
        } else if m.joining.is_some_and(|(j, _)| j == p) && live {
            (Role::Joining, Vec::new(), Vec::new())
        } else {
            (Role::Deposed, Vec::new(), Vec::new())
        };
        Desired {
            role,
            epoch: m.epoch,
            backups,
            joining,
            join_epoch: m.joining.map_or(0, |(_, e)| e),
        }
    }

    /// Where every shard's primary is (`addrs`: the processes' addresses).
    pub fn routes(&self, addrs: &[String]) -> pb::RouteResponse {
        pb::RouteResponse {
            shards: self
                .shards
                .iter()
                .enumerate()
                .map(|(s, m)| pb::ShardRoute {
                    shard: s as u32,
                    epoch: m.epoch,
                    addr: m
                        .primary
                        .and_then(|p| addrs.get(p).cloned())
                        .unwrap_or_default(),
                    incarnation: m.primary.map_or(0, |p| self.procs[p].incarnation),
                })
                .collect(),
            failovers: self.failovers,
            dropped_backups: self.dropped,
            rejoins: self.rejoins,
        }
    }

    /// The map of shard `s`.
    pub fn shard(&self, s: usize) -> &ShardMap {
        &self.shards[s]
    }

    /// Shards (= processes) in the map.
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// The cluster has `n` shards now, `base` of them its start's (shards added or removed
    /// while training, see `sparta_ps::scaler`): an added shard's primary is on its own new
    /// process at epoch 1 and its backups where [`Placement`] puts them (the PS holding them
    /// made them empty before any row was routed to the shard); a removed one (only shards
    /// added while training leave) is forgotten with its process.
    pub fn resize(&mut self, n: usize, base: usize) -> Result<Vec<String>, Refusal> {
        let old = self.shards.len();
        if n == old {
            return Ok(Vec::new());
        }
        let placement = Placement::with_base(self.placement.replicas, n, base)?;
        if n < base.min(old) {
            return Err(Refusal::Config(format!(
                "the cluster's shards cannot become {n}: the {base} shard(s) of the start stay"
            )));
        }
        let mut events = Vec::new();
        if n > old {
            for s in old..n {
                let backups = placement.backups_of(s);
                events.push(format!(
                    "shard {s} added: its primary on process {s}, backups on {backups:?}"
                ));
                self.shards.push(ShardMap {
                    epoch: 1,
                    primary: Some(s),
                    backups,
                    joining: None,
                });
                self.procs.push(ProcState::default());
            }
        } else {
            events.push(format!(
                "shard(s) {n}..{} left the cluster with their processes",
                old - 1
            ));
            self.shards.truncate(n);
            self.procs.truncate(n);
            // Copies of the gone shards on the staying processes are no longer in any map.
            for m in &mut self.shards {
                m.backups.retain(|&b| b < n);
                if m.joining.is_some_and(|(j, _)| j >= n) {
                    m.joining = None;
                }
            }
        }
        self.placement = placement;
        Ok(events)
    }

    /// The map a coordinator wrote ([`state_json`]) before it died, for its restart: every
    /// shard's epoch and copies, each process's incarnation (a process restarted meanwhile
    /// is then seen as such: its copies' state is gone) and the counts. Processes not heard
    /// since are silent from the restart on, so a dead one is declared dead `dead_after`
    /// later. A map of another cluster (its process count) is refused.
    pub fn restore(
        (processes, base): (usize, usize),
        replicas: usize,
        dead_after: Duration,
        state: &serde_json::Value,
    ) -> Result<Self, Refusal> {
        let mut m = Self::with_base(processes, replicas, base, dead_after)?;
        let bad = |what: &str| {
            Refusal::Config(format!(
                "the coordinator's saved map does not fit this cluster ({processes} PS processes, \
                 {replicas} copies): {what}"
            ))
        };
        let num = |v: &serde_json::Value, what: &str| v.as_u64().ok_or_else(|| bad(what));
        let proc_of = |v: &serde_json::Value, what: &str| -> Result<usize, Refusal> {
            let p = num(v, what)? as usize;
            if p < processes {
                Ok(p)
            } else {
                Err(bad(&format!("{what} names process {p}")))
            }
        };
        let shards = state["shards"]
            .as_array()
            .filter(|s| s.len() == processes)
            .ok_or_else(|| bad("`shards` must list every shard"))?;
        for (s, x) in shards.iter().enumerate() {
            let map = &mut m.shards[s];
            map.epoch = num(&x["epoch"], "a shard's `epoch`")?;
            map.primary = match &x["primary"] {
                serde_json::Value::Null => None,
                v => Some(proc_of(v, "a shard's `primary`")?),
            };
            map.backups = x["backups"]
                .as_array()
                .ok_or_else(|| bad("a shard's `backups`"))?
                .iter()
                .map(|b| proc_of(b, "a shard's `backups`"))
                .collect::<Result<_, _>>()?;
            map.joining = match x["joining"].as_array().map(Vec::as_slice) {
                Some([p, e]) => Some((proc_of(p, "`joining`")?, num(e, "`joining`")?)),
                _ => None,
            };
        }
        let procs = state["processes"]
            .as_array()
            .filter(|p| p.len() == processes)
            .ok_or_else(|| bad("`processes` must list every PS process"))?;
        for (st, x) in m.procs.iter_mut().zip(procs) {
            st.incarnation = num(&x["incarnation"], "a process's `incarnation`")?;
            st.dead = x["dead"].as_bool().unwrap_or(false);
        }
        m.failovers = num(&state["failovers"], "`failovers`")?;
        m.dropped = num(&state["dropped_backups"], "`dropped_backups`")?;
        m.rejoins = num(&state["rejoins"], "`rejoins`")?;
        Ok(m)
    }
}

/// How the coordinator runs.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Every PS address, in shard order.
    pub addrs: Vec<String>,
    /// Copies of every shard (as given to every PS).
    pub replicas: usize,
    /// The cluster's token.
    pub token: String,
    /// How often each PS is asked for its roles.
    pub interval: Duration,
    /// Silence after which a PS is dead.
    pub dead_after: Duration,
    /// Written after every change of the map (JSON: failovers, dropped backups, rejoins,
    /// every shard's epoch and primary), replaced atomically: what `sparta launch` reports.
    pub state_file: Option<std::path::PathBuf>,
    /// Start from the map in `state_file` when it exists (a restarted coordinator of the
    /// same cluster, see [`Membership::restore`]); else from every shard's first map.
    pub restore: bool,
    /// Shards the cluster started with when some were added since (`--dense-shards`;
    /// `None`: every address is a start shard's).
    pub start_shards: Option<usize>,
    /// TLS identity of the route service the workers ask (plain gRPC when `None`).
    pub tls: Option<sparta_proto::tls::ServerTls>,
    /// How the PS processes' TLS certificates are verified (they serve plain gRPC when `None`).
    pub ps_tls: Option<sparta_proto::tls::ClientTls>,
}

/// The map as JSON (see [`CoordinatorConfig::state_file`]).
pub fn state_json(m: &Membership) -> serde_json::Value {
    serde_json::json!({
        "failovers": m.failovers,
        "dropped_backups": m.dropped,
        "rejoins": m.rejoins,
        "shards": m.shards.iter().enumerate().map(|(s, x)| serde_json::json!({
            "shard": s,
            "epoch": x.epoch,
            "primary": x.primary,
            "backups": x.backups,
            "joining": x.joining.map(|(p, e)| [p as u64, e]),
        })).collect::<Vec<_>>(),
        // For a restarted coordinator (see [`Membership::restore`]).
        "processes": m.procs.iter().map(|p| serde_json::json!({
            "incarnation": p.incarnation,
            "dead": p.dead,
        })).collect::<Vec<_>>(),
    })
}

/// Writes `v` to `path` through a temporary file and a rename.
fn write_state(path: &std::path::Path, v: &serde_json::Value) {
    let tmp = path.with_extension("tmp");
    let r = std::fs::write(&tmp, v.to_string() + "\n").and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        tracing::warn!("coordinator: writing {}: {e}", path.display());
    }
}

#[derive(Clone)]
struct Service {
    state: Arc<Mutex<Membership>>,
    addrs: Arc<parking_lot::RwLock<Vec<String>>>,
}

#[tonic::async_trait]
impl Coordinator for Service {
    async fn route(
        &self,
        _req: Request<pb::RouteRequest>,
    ) -> Result<Response<pb::RouteResponse>, Status> {
        let addrs = self.addrs.read().clone();
        Ok(Response::new(self.state.lock().routes(&addrs)))
    }
}

/// Why a PS's heartbeat failed, for the log: its status, with what to check when the cause is
/// the coordinator's own configuration rather than a dead process (`tls`: the coordinator
/// verifies the PS over TLS), classified as a worker's failed calls are. The first part is
/// the kind of failure: the log repeats a failure only when its kind changes (a plain client
/// of a TLS port gets one of two messages by turns).
fn heartbeat_error(s: &tonic::Status, tls: bool) -> (Cause, String) {
    let cause = classify(s.code(), s.message(), !tls);
    let hint = match cause {
        // Unless the PS's answer names the flags itself.
        Cause::Token if !s.message().contains("--token-file") => {
            "; is this the cluster's token (--token-file / SPARTA_TOKEN)?"
        }
        Cause::TlsHandshake => "; check --tls-ca and --tls-domain",
        Cause::PlainToTls => {
            "; if the PS processes serve TLS, pass --tls-cert, --tls-key and --tls-ca"
        }
        _ => "",
    };
    (cause, format!("{:?}: {}{hint}", s.code(), s.message()))
}

/// Heartbeats one PS and brings its copies to the roles the map wants: the map's changes, and
/// why the heartbeat failed when it did.
async fn check(
    p: usize,
    mut client: PeerClient,
    state: Arc<Mutex<Membership>>,
    addrs: Arc<parking_lot::RwLock<Vec<String>>>,
    timeout: Duration,
    tls: bool,
) -> (usize, Vec<String>, Option<(Cause, String)>) {
    let roles = tokio::time::timeout(timeout, client.roles(pb::RolesRequest {})).await;
    let roles = match roles {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => {
            let events = state.lock().missed(p, Instant::now());
            return (p, events, Some(heartbeat_error(&s, tls)));
        }
        Err(_) => {
            let events = state.lock().missed(p, Instant::now());
            let why = format!("no answer within {timeout:?}");
            return (p, events, Some((Cause::Timeout, why)));
        }
    };
    let mut events = state.lock().heard(p, roles.incarnation);
    // Shards added or removed while training: the shards the process knows.
    let known = |list: &[String]| (!list.is_empty()).then(|| list.to_vec());
    let list = match (known(&roles.shard_addrs), known(&roles.next_shard_addrs)) {
        (Some(now), Some(next)) => Some(if next.len() > now.len() { next } else { now }),
        (now, next) => now.or(next),
    };
    if let Some(list) = list {
        let mut addrs = addrs.write();
        if *addrs != list {
            let base = (roles.start_shards as usize).max(1);
            match state.lock().resize(list.len(), base) {
                Ok(ev) => {
                    events.extend(ev);
                    *addrs = list;
                }
                Err(e) => events.push(format!("process {p}: its list of shards: {e}")),
            }
        }
    }
    let n = state.lock().num_shards();
    let roles_copies: Vec<&pb::CopyRole> = roles
        .copies
        .iter()
        .filter(|c| (c.shard as usize) < n)
        .collect();
    for c in roles_copies.iter().copied() {
        if c.role == Role::Primary as i32 {
            let in_sync: Vec<usize> = c.in_sync.iter().map(|&b| b as usize).collect();
            events.extend(
                state
                    .lock()
                    .reported(p, c.shard as usize, c.epoch, &in_sync),
            );
        }
    }
    events.extend(state.lock().plan_joins());
    for c in roles_copies {
        let d = state.lock().desired(p, c.shard as usize);
        let (role, epoch) = (d.role, d.epoch);
        if c.role == role as i32 && c.epoch == epoch {
            continue;
        }
        let procs = |v: &[usize]| v.iter().map(|&b| b as u32).collect();
        let order = pb::ReconfigureRequest {
            shard: c.shard,
            epoch,
            role: role as i32,
            backups: procs(&d.backups),
            joining: procs(&d.joining),
            join_epoch: d.join_epoch,
        };
        match tokio::time::timeout(timeout, client.reconfigure(order)).await {
            Ok(Ok(_)) => events.push(format!(
                "process {p}: its copy of shard {} is now {} at epoch {epoch}",
                c.shard,
                role.as_str_name()
            )),
            Ok(Err(s)) => events.push(format!(
                "process {p}: reconfiguring its copy of shard {} failed: {}",
                c.shard,
                s.message()
            )),
            Err(_) => {}
        }
    }
    (p, events, None)
}

/// Serves `Route` on `listener` and watches the PS processes until `shutdown`.
pub async fn run(
    cfg: CoordinatorConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), PsError> {
    let base = cfg.start_shards.unwrap_or(cfg.addrs.len());
    let saved = match (&cfg.state_file, cfg.restore) {
        (Some(f), true) if f.exists() => {
            let text = std::fs::read_to_string(f).map_err(|e| {
                PsError::Config(format!("coordinator: reading {}: {e}", f.display()))
            })?;
            let v = serde_json::from_str(&text)
                .map_err(|e| PsError::Config(format!("coordinator: {}: {e}", f.display())))?;
            Some((f, v))
        }
        _ => None,
    };
    let m = match &saved {
        Some((f, v)) => {
            let m = Membership::restore((cfg.addrs.len(), base), cfg.replicas, cfg.dead_after, v)
                .map_err(|e| PsError::Config(format!("coordinator: {}: {e}", f.display())))?;
            tracing::warn!(
                "coordinator: restarted with the shard map of {} ({} failover(s), {} rejoin(s) \
                 so far)",
                f.display(),
                m.failovers,
                m.rejoins
            );
            m
        }
        None => Membership::with_base(cfg.addrs.len(), cfg.replicas, base, cfg.dead_after)?,
    };
    let state = Arc::new(Mutex::new(m));
    let connect = |a: &String| peer_client(a, &cfg.token, 16 << 20, cfg.ps_tls.as_ref());
    let mut clients = cfg
        .addrs
        .iter()
        .map(connect)
        .collect::<Result<Vec<_>, _>>()?;
    // The PS addresses now (more or fewer once shards are added or removed while training).
    let shared_addrs = Arc::new(parking_lot::RwLock::new(cfg.addrs.clone()));
    let watch = {
        let state = Arc::clone(&state);
        let timeout = cfg.interval.max(Duration::from_millis(200)) * 2;
        let state_file = cfg.state_file.clone();
        let shared = Arc::clone(&shared_addrs);
        let mut addrs = cfg.addrs.clone();
        let tls = cfg.ps_tls.is_some();
        let (token, ps_tls) = (cfg.token.clone(), cfg.ps_tls.clone());
        async move {
            // The map as last written: written again whenever it differs (a change, or a
            // process's incarnation first heard, which a restarted coordinator needs).
            let mut written = None;
            if let Some(f) = &state_file {
                let v = state_json(&state.lock());
                write_state(f, &v);
                written = Some(v);
            }
            // The kind of each process's last heartbeat failure, logged when it changes (not
            // every beat).
            let mut failing: Vec<Option<Cause>> = vec![None; clients.len()];
            loop {
                let mut changed = false;
                // Shards added or removed (a heartbeat's answer told): their processes.
                let now = shared.read().clone();
                if now != addrs {
                    let kept = addrs.iter().zip(&now).take_while(|(a, b)| a == b).count();
                    clients.truncate(kept);
                    for a in &now[kept..] {
                        match peer_client(a, &token, 16 << 20, ps_tls.as_ref()) {
                            Ok(c) => clients.push(c),
                            Err(e) => {
                                tracing::warn!("coordinator: PS at {a}: {e}");
                                break;
                            }
                        }
                    }
                    failing.resize(clients.len(), None);
                    addrs = now[..clients.len()].to_vec();
                    changed = true;
                }
                let mut round = tokio::task::JoinSet::new();
                for (p, c) in clients.iter().enumerate() {
                    let (state, shared) = (Arc::clone(&state), Arc::clone(&shared));
                    round.spawn(check(p, c.clone(), state, shared, timeout, tls));
                }
                while let Some(Ok((p, events, error))) = round.join_next().await {
                    for e in events {
                        changed = true;
                        tracing::warn!("coordinator: {e}");
                    }
                    let kind = error.as_ref().map(|e| e.0);
                    if kind != failing[p] {
                        match &error {
                            Some((_, e)) => tracing::warn!(
                                "coordinator: PS process {p} at {}: heartbeat failed: {e}",
                                addrs[p]
                            ),
                            None => tracing::info!(
                                "coordinator: PS process {p} at {} answers again",
                                addrs[p]
                            ),
                        }
                        failing[p] = kind;
                    }
                }
                if let Some(f) = &state_file {
                    let v = state_json(&state.lock());
                    if changed || written.as_ref() != Some(&v) {
                        write_state(f, &v);
                        written = Some(v);
                    }
                }
                tokio::time::sleep(cfg.interval).await;
            }
        }
    };
    let svc = CoordinatorServer::with_interceptor(
        Service {
            state,
            addrs: shared_addrs,
        },
        sparta_proto::auth::CheckToken::new(
            &cfg.token,
            Arc::new(sparta_proto::metrics::Metrics::new("coordinator")),
        ),
    );
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &cfg.tls {
        server = server
            .tls_config(tls.config())
            .map_err(|e| PsError::Config(format!("coordinator: TLS: {e}")))?;
    }
    let serve = server.add_service(svc).serve_with_incoming_shutdown(
        tonic::transport::server::TcpIncoming::from(listener),
        shutdown,
    );
    tokio::select! {
        r = serve => r.map_err(|e| PsError::Serve(format!("coordinator: {e}"))),
        () = watch => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEAD: Duration = Duration::from_secs(1);

    #[test]
    fn shards_added_and_removed_while_training_join_and_leave_the_map() {
        let mut m = Membership::new(2, 2, DEAD).unwrap();
        let ev = m.resize(3, 2).unwrap();
        assert_eq!(ev.len(), 1, "{ev:?}");
        // Shard 2: primary on its own process, its backup on process 0 (the placement
        // after); the start's shards keep theirs.
        let added = m.shard(2).clone();
        assert_eq!(
            (added.epoch, added.primary, added.backups),
            (1, Some(2), vec![0])
        );
        assert_eq!(m.shard(1).backups, vec![0]);
        assert_eq!(m.desired(0, 2).role, Role::Backup);
        assert_eq!(m.desired(2, 2).role, Role::Primary);
        assert_eq!(m.desired(2, 2).backups, vec![0]);
        let addrs: Vec<String> = (0..3).map(|i| format!("ps{i}")).collect();
        assert_eq!(m.routes(&addrs).shards[2].addr, "ps2");
        // Its process dies: the backup on process 0 takes over, as for a start shard.
        m.heard(2, 7);
        m.missed(2, Instant::now());
        m.missed(2, Instant::now() + 2 * DEAD);
        assert_eq!(m.shard(2).primary, Some(0));
        // Back to 2: shard 2 and its process leave the map; the start's shards cannot.
        m.resize(2, 2).unwrap();
        assert_eq!(m.num_shards(), 2);
        assert!(m.resize(1, 2).is_err());
        assert!(m.resize(2, 2).unwrap().is_empty());
        // A routes answer for fewer addresses than shards names no address for the others.
        m.resize(3, 2).unwrap();
        assert_eq!(m.routes(&addrs[..2]).shards[2].addr, "");
    }

    #[test]
    fn heartbeat_errors_say_what_to_check() {
        use tonic::{Code, Status};
        let (kind, token) = heartbeat_error(&Status::unauthenticated("missing token"), false);
        assert!(
            kind == Cause::Token && token.contains("SPARTA_TOKEN"),
            "{token}"
        );
        let named = "wrong token; use the cluster's --token-file / SPARTA_TOKEN";
        let (_, once) = heartbeat_error(&Status::unauthenticated(named), false);
        assert_eq!(once.matches("--token-file").count(), 1, "{once}");
        let (kind, cert) = heartbeat_error(&Status::unavailable("invalid peer certificate"), true);
        assert!(
            kind == Cause::TlsHandshake && cert.contains("--tls-domain"),
            "{cert}"
        );
        // A plain coordinator at a TLS port gets these two by turns: one kind.
        for (code, m) in [
            (Code::Unknown, "transport error"),
            (Code::Internal, "h2 protocol error"),
        ] {
            let (kind, plain) = heartbeat_error(&Status::new(code, m), false);
            assert!(
                kind == Cause::PlainToTls && plain.contains("--tls-ca"),
                "{plain}"
            );
        }
        // A dead process is no configuration error: no hint.
        let dead = heartbeat_error(&Status::unavailable("tcp connect error: refused"), false);
        assert_eq!(
            dead,
            (
                Cause::Refused,
                "Unavailable: tcp connect error: refused".into()
            )
        );
    }

    fn heard_all(m: &mut Membership) {
        for p in 0..3 {
            m.heard(p, 100 + p as u64);
        }
    }

    #[test]
    fn a_silent_primary_is_replaced_by_its_backup_at_a_new_epoch() {
        let mut m = Membership::new(3, 2, DEAD).unwrap();
        heard_all(&mut m);
        let t0 = Instant::now();
        assert!(m.missed(1, t0).is_empty());
        assert!(m.missed(1, t0 + DEAD / 2).is_empty(), "not dead yet");
        let ev = m.missed(1, t0 + DEAD);
        assert!(ev.iter().any(|e| e.contains("shard 1")), "{ev:?}");
        // Shard 1's backup (process 2) is its primary; shard 0 lost its backup (process 1).
        assert_eq!(
            m.shard(1),
            &ShardMap {
                epoch: 2,
                primary: Some(2),
                backups: vec![],
                joining: None,
            }
        );
        assert_eq!(
            m.shard(0),
            &ShardMap {
                epoch: 2,
                primary: Some(0),
                backups: vec![],
                joining: None,
            }
        );
        assert_eq!(m.shard(2).epoch, 1, "untouched");
        assert_eq!(
            (m.desired(2, 1).role, m.desired(2, 1).epoch),
            (Role::Primary, 2)
        );
        assert_eq!(m.desired(0, 0).backups, Vec::<usize>::new());
        // The dead process's copies, should it answer again, are deposed.
        assert_eq!(m.desired(1, 1).role, Role::Deposed);
        assert_eq!(m.desired(1, 0).role, Role::Deposed);
        assert!(m.plan_joins().is_empty(), "no live process to rejoin");
        let r = m.routes(&["a".into(), "b".into(), "c".into()]);
        assert_eq!(r.failovers, 1);
        assert_eq!(r.dropped_backups, 1);
        assert_eq!((r.shards[1].addr.as_str(), r.shards[1].epoch), ("c", 2));
        assert_eq!(r.shards[1].incarnation, 102);
        // Heard again (same incarnation, e.g. after a partition): out until it rejoined.
        m.heard(1, 101);
        assert_eq!(m.desired(1, 1).role, Role::Deposed);
        let ev = m.plan_joins();
        assert_eq!(ev.len(), 2, "{ev:?}");
        // Shard 1: process 1 receives a copy of process 2's; shard 0 likewise from 0.
        let d = m.desired(2, 1);
        assert_eq!((d.role, d.epoch, d.joining), (Role::Primary, 3, vec![1]));
        assert_eq!(m.desired(1, 1).role, Role::Joining);
        assert!(m.plan_joins().is_empty(), "one join at a time");
        // Process 2 says process 1 caught up: a backup of shard 1, eligible for promotion;
        // not before it is at the join's epoch (its link to process 1 may be an old one).
        assert!(m.reported(2, 1, 3, &[]).is_empty());
        assert!(m.reported(2, 1, 2, &[1]).is_empty());
        assert_eq!(m.reported(2, 1, 3, &[1]).len(), 1);
        assert_eq!(m.shard(1).backups, vec![1]);
        assert_eq!(m.desired(1, 1).role, Role::Backup);
        assert_eq!(m.desired(2, 1).epoch, 4);
        // Now process 2 dies: shard 1 fails over to the rejoined copy.
        let t1 = t0 + DEAD * 5;
        m.missed(2, t1);
        m.missed(2, t1 + DEAD);
        assert_eq!(m.shard(1).primary, Some(1));
        // Process 2 was also shard 2's primary: its backup (process 0) took over.
        assert_eq!(m.shard(2).primary, Some(0));
        assert_eq!(m.routes(&["a".into(), "b".into(), "c".into()]).failovers, 3);
    }

    #[test]
    fn a_restored_map_carries_on_and_sees_processes_restarted_meanwhile() {
        let mut m = Membership::new(3, 2, DEAD).unwrap();
        heard_all(&mut m);
        let t0 = Instant::now();
        m.missed(1, t0);
        m.missed(1, t0 + DEAD);
        m.heard(1, 101);
        m.plan_joins();
        let saved = state_json(&m);
        let mut r = Membership::restore((3, 3), 2, DEAD, &saved).unwrap();
        assert_eq!(state_json(&r), saved);
        for s in 0..3 {
            assert_eq!(r.shard(s), m.shard(s));
        }
        assert_eq!(r.desired(1, 1).role, Role::Joining);
        // Process 2 (shard 1's primary now) restarted while no coordinator ran: heard with
        // another incarnation, its shards fail over at once.
        let ev = r.heard(2, 555);
        assert!(ev[0].contains("restarted"), "{ev:?}");
        assert_eq!(r.shard(2).primary, Some(0));
        assert_eq!(r.routes(&["a".into(), "b".into(), "c".into()]).failovers, 2);
        // Another cluster's map is refused, naming what does not fit.
        let e = Membership::restore((4, 4), 2, DEAD, &saved)
            .unwrap_err()
            .to_string();
        assert!(e.contains("4 PS processes") && e.contains("shards"), "{e}");
    }

    #[test]
    fn a_restarted_process_loses_its_shards_at_once() {
        let mut m = Membership::new(3, 2, DEAD).unwrap();
        heard_all(&mut m);
        let ev = m.heard(0, 999);
        assert!(ev[0].contains("restarted"), "{ev:?}");
        assert_eq!(m.shard(0).primary, Some(1));
        assert_eq!(m.shard(2).backups, Vec::<usize>::new());
        assert_eq!(m.desired(0, 0).role, Role::Deposed);
    }

    #[test]
    fn a_shard_with_no_live_copy_is_lost_and_a_second_failure_fails_over_again() {
        let mut m = Membership::new(3, 2, DEAD).unwrap();
        heard_all(&mut m);
        let t0 = Instant::now();
        m.missed(1, t0);
        m.missed(1, t0 + DEAD);
        // Process 2 (now primary of shards 1 and 2, no backups) dies too.
        m.missed(2, t0 + DEAD);
        let ev = m.missed(2, t0 + DEAD * 2);
        assert!(
            ev.iter().any(|e| e.contains("every copy is lost")),
            "{ev:?}"
        );
        assert_eq!(m.shard(1).primary, None);
        assert_eq!(
            m.routes(&["a".into(), "b".into(), "c".into()]).shards[1].addr,
            ""
        );
        // Never-heard processes (still starting) are not declared dead.
        let mut fresh = Membership::new(3, 2, DEAD).unwrap();
        assert!(fresh.missed(0, t0 + DEAD * 10).is_empty());
        assert_eq!(fresh.shard(0).primary, Some(0));
    }

    #[test]
    fn with_three_copies_the_first_live_backup_is_promoted() {
        let mut m = Membership::new(4, 3, DEAD).unwrap();
        for p in 0..4 {
            m.heard(p, 1 + p as u64);
        }
        let t0 = Instant::now();
        m.missed(1, t0);
        m.missed(1, t0 + DEAD);
        // Shard 0: backups were 1 and 2; 1 died: it keeps backup 2.
        assert_eq!(m.shard(0).backups, vec![2]);
        // Shard 1: backups 2 and 3; 2 is promoted, 3 dropped (it followed the old primary).
        assert_eq!(m.shard(1).primary, Some(2));
        assert_eq!(m.desired(3, 1).role, Role::Deposed);
    }
}

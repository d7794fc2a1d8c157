//! Where a worker sends each shard's requests. Without a coordinator: the address `--ps`
//! lists, for good. With one (`--coordinator`, a replicated cluster with failover): the
//! primary the coordinator names; a request that found its primary gone or deposed asks the
//! coordinator again and, once it names a new primary (a newer epoch), goes there.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

use sparta_proto::auth::AddToken;
use sparta_proto::headers::NOT_PRIMARY;
use sparta_proto::pb;
use sparta_proto::pb::coordinator_client::CoordinatorClient;
use sparta_proto::status::Cause;
use sparta_proto::tls::ClientTls;
use sparta_proto::ProtoError;

use super::Client;

/// A gRPC client of the coordinator.
pub type Coord = CoordinatorClient<InterceptedService<Channel, AddToken>>;

/// Builds a client of the PS at an address, with the given interceptor.
pub(super) type Connect = dyn Fn(&str, AddToken) -> Result<Client, ProtoError> + Send + Sync;

/// A gRPC client of the coordinator at `addr`, over TLS verified with `tls` when given (lazy:
/// must run inside a tokio runtime).
pub fn coordinator_client(
    addr: &str,
    token: &str,
    tls: Option<&ClientTls>,
) -> Result<Coord, ProtoError> {
    let ep = sparta_proto::tls::endpoint(addr, tls, "--coordinator")?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5));
    let token = AddToken::new(token)?;
    Ok(CoordinatorClient::with_interceptor(
        ep.connect_lazy(),
        token,
    ))
}

/// One shard's current primary.
struct Entry {
    addr: String,
    client: Client,
    token: AddToken,
    epoch: u64,
}

/// The route of every shard.
pub(super) struct Routes {
    /// By shard; grows and shrinks at the end when the cluster's shards change (at a round).
    entries: RwLock<Vec<RwLock<Entry>>>,
    coord: Option<(Coord, AddToken, Arc<Connect>)>,
}

impl Routes {
    /// Fixed routes: `clients[i]` serves shard `i` (at `addrs[i]`).
    pub fn fixed(shards: Vec<(String, Client, AddToken)>) -> Self {
        Self {
            entries: RwLock::new(
                shards
                    .into_iter()
                    .map(|(addr, client, token)| {
                        RwLock::new(Entry {
                            addr,
                            client,
                            token,
                            epoch: 0,
                        })
                    })
                    .collect(),
            ),
            coord: None,
        }
    }

    /// Routes that follow the coordinator `coord`; `token` is the cluster's, `connect`
    /// builds a client of a new primary.
    pub fn coordinated(self, coord: Coord, token: AddToken, connect: Arc<Connect>) -> Self {
        Self {
            coord: Some((coord, token, connect)),
            ..self
        }
    }

    /// Whether a coordinator moves the routes.
    pub fn follows_coordinator(&self) -> bool {
        self.coord.is_some()
    }

    /// The client and address of shard `shard`'s primary as last known.
    pub fn current(&self, shard: usize) -> (Client, String) {
        let entries = self.entries.read();
        let e = entries[shard].read();
        (e.client.clone(), e.addr.clone())
    }

    /// A shard added at the end (fixed routes: the cluster's shards changed at a round).
    pub fn push_fixed(&self, addr: String, client: Client, token: AddToken) {
        self.entries.write().push(RwLock::new(Entry {
            addr,
            client,
            token,
            epoch: 0,
        }));
    }

    /// Keeps the first `n` shards (the others left the cluster at a round).
    pub fn truncate(&self, n: usize) {
        self.entries.write().truncate(n);
    }

    /// Resolves once the coordinator names another primary of `shard` than the one at
    /// `addr` (asked every `every`): a call hanging on a primary that stopped answering
    /// without closing its connections (frozen, cut off) is given up for the new one. A new
    /// epoch of the same primary (a backup joined or was taken out) is no reason: the call
    /// may be long by design (a checkpoint barrier waits for every worker), and giving it up
    /// would only send it again.
    pub async fn moved_from(&self, shard: usize, addr: String, every: std::time::Duration) {
        loop {
            tokio::time::sleep(every).await;
            if self.refresh(shard).await.is_ok() && self.addr(shard) != addr {
                return;
            }
        }
    }

    /// The address of shard `shard`'s primary as last known.
    pub fn addr(&self, shard: usize) -> String {
        self.entries
            .read()
            .get(shard)
            .map_or_else(String::new, |e| e.read().addr.clone())
    }

    /// Asks the coordinator where every primary is and moves every shard whose primary
    /// changed (a newer epoch); returns whether `shard`'s did.
    pub async fn refresh(&self, shard: usize) -> Result<bool, Status> {
        let Some((coord, token, connect)) = &self.coord else {
            return Ok(false);
        };
        let routes = coord.clone().route(pb::RouteRequest {}).await?.into_inner();
        let mut moved = false;
        let entries = self.entries.read();
        for r in routes.shards {
            let Some(cell) = entries.get(r.shard as usize) else {
                continue;
            };
            if r.addr.is_empty() || r.epoch <= cell.read().epoch {
                continue;
            }
            {
                // The primary the worker connected to (its incarnation already checked):
                // only the epoch is new.
                let e = cell.read();
                if e.epoch == 0 && e.addr == r.addr {
                    drop(e);
                    let mut e = cell.write();
                    e.epoch = r.epoch;
                    e.token.expect_epoch(r.epoch);
                    continue;
                }
            }
            let t = token.for_copy(r.shard, r.epoch);
            t.expect_incarnation(r.incarnation);
            let client =
                connect(&r.addr, t.clone()).map_err(|e| Status::invalid_argument(e.to_string()))?;
            let mut e = cell.write();
            if r.epoch > e.epoch {
                if e.epoch != 0 {
                    tracing::warn!(
                        "PS shard {}: its primary is now {} (epoch {}; was {} at epoch {})",
                        r.shard,
                        r.addr,
                        r.epoch,
                        e.addr,
                        e.epoch
                    );
                }
                *e = Entry {
                    addr: r.addr,
                    client,
                    token: t,
                    epoch: r.epoch,
                };
                moved |= r.shard as usize == shard;
            }
        }
        Ok(moved)
    }
}

/// Does a failed call mean the shard's primary may have moved (it is gone, restarted, or
/// says it is not the primary)?
pub(super) fn primary_moved(s: &Status, cause: Cause) -> bool {
    matches!(
        cause,
        Cause::Refused
            | Cause::Unreachable
            | Cause::ConnectionLost
            | Cause::Restarted
            | Cause::Timeout
    ) || (s.code() == Code::FailedPrecondition && s.message().starts_with(NOT_PRIMARY))
        || s.code() == Code::Unknown
}

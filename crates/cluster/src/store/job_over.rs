//! The end of a job: worker 0's last word to every PS process (`WorkerDone { job_over }`),
//! on which a PS run with `sparta ps --exit-when-done` exits 0 (a Kubernetes Job of shards
//! then completes with the workers').

use super::*;

/// How long one PS process is given to take the word.
const JOB_OVER_WAIT: Duration = Duration::from_secs(10);

impl RemoteStore {
    /// Tells every PS process (each `--ps` address once) that the job is over. Each gets a
    /// fresh connection expecting no incarnation and naming no shard, so a process restarted
    /// since the start (rejoined as a backup) hears it too. Returns the addresses that did
    /// not take it (unreachable or gone): the job's results are written by then, so that is
    /// for the caller to log, not an error.
    pub fn end_job(&self) -> Vec<(String, String)> {
        let token = match AddToken::new(&self.cfg.token) {
            Ok(t) => t,
            Err(e) => {
                return (self.cfg.addrs.iter())
                    .map(|a| (a.clone(), e.to_string()))
                    .collect()
            }
        };
        let rank = self.cfg.rank as u32;
        let calls: Vec<_> = (self.cfg.addrs.iter())
            .map(|addr| {
                let (addr, tls, token) = (addr.clone(), self.cfg.tls.clone(), token.for_shard());
                self.rt.spawn(async move {
                    let r = tell(&addr, tls.as_ref(), token, rank).await;
                    (addr, r)
                })
            })
            .collect();
        self.rt.block_on(async move {
            let mut missed = Vec::new();
            for c in calls {
                match c.await {
                    Ok((_, Ok(()))) => {}
                    Ok((addr, Err(e))) => missed.push((addr, e)),
                    Err(e) => missed.push((String::new(), format!("the task failed: {e}"))),
                }
            }
            missed
        })
    }
}

/// One PS process's `WorkerDone { job_over }`.
async fn tell(
    addr: &str,
    tls: Option<&ClientTls>,
    token: AddToken,
    rank: u32,
) -> Result<(), String> {
    let ep = sparta_proto::tls::endpoint(addr, tls, "PS")
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(JOB_OVER_WAIT);
    let mut client = ParameterServerClient::with_interceptor(ep.connect_lazy(), token);
    let req = pb::WorkerDoneRequest {
        rank,
        job_over: true,
        ..pb::WorkerDoneRequest::default()
    };
    client
        .worker_done(req)
        .await
        .map(drop)
        .map_err(|s| s.message().to_string())
}

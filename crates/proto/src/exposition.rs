//! One `/metrics` for a whole local cluster (`sparta launch --metrics-listen`): the launcher
//! fetches each child's Prometheus text exposition ([`fetch`]) and [`merge`]s them, every
//! sample labelled with the process it came from (`process="ps0"`, `"w1"`, ...), each metric
//! family's `# HELP` and `# TYPE` written once, so a scraper or a parser reads one valid
//! exposition.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::ProtoError;

/// One metric family of the merged exposition: its metadata lines and samples.
#[derive(Default)]
struct Family {
    name: String,
    /// `# HELP`, `# TYPE`, `# UNIT` lines, the first source's.
    meta: Vec<String>,
    samples: Vec<String>,
}

/// The expositions of `sources` (`(process, text)`) as one: families in order of first
/// appearance, each sample with a `process` label added first. A source's `# EOF` ends it;
/// the merged text ends with `# EOF` (OpenMetrics) when any source did.
pub fn merge(sources: &[(String, String)]) -> String {
    let mut families: Vec<Family> = Vec::new();
    let mut eof = false;
    for (process, text) in sources {
        let mut current: Option<usize> = None;
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            if line == "# EOF" {
                eof = true;
                break;
            }
            if let Some(rest) = line.strip_prefix("# ") {
                let mut parts = rest.splitn(3, ' ');
                let (kind, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                if matches!(kind, "HELP" | "TYPE" | "UNIT") && !name.is_empty() {
                    let i = family(&mut families, name);
                    let f = &mut families[i];
                    let prefix = format!("# {kind} ");
                    if !f.meta.iter().any(|m| m.starts_with(&prefix)) {
                        f.meta.push(line.to_string());
                    }
                    current = Some(i);
                }
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..name_end];
            // A sample belongs to the family declared last when its name extends it
            // (`_total`, `_bucket`, `_sum`, `_count`, ...); else it is a family of its own.
            let i = match current.filter(|&i| name.starts_with(&families[i].name)) {
                Some(i) => i,
                None => family(&mut families, name),
            };
            families[i].samples.push(labelled(line, name_end, process));
        }
    }
    let mut out = String::new();
    for f in &families {
        for line in f.meta.iter().chain(&f.samples) {
            out.push_str(line);
            out.push('\n');
        }
    }
    if eof {
        out.push_str("# EOF\n");
    }
    out
}

/// The index of family `name`, added when new.
fn family(families: &mut Vec<Family>, name: &str) -> usize {
    if let Some(i) = families.iter().position(|f| f.name == name) {
        return i;
    }
    families.push(Family {
        name: name.to_string(),
        ..Family::default()
    });
    families.len() - 1
}

/// Sample `line` (its name ending at `name_end`) with `process="..."` as its first label.
fn labelled(line: &str, name_end: usize, process: &str) -> String {
    let value = process
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    let (name, rest) = line.split_at(name_end);
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{name}{{process=\"{value}\"{labels}"),
        Some(labels) => format!("{name}{{process=\"{value}\",{labels}"),
        None => format!("{name}{{process=\"{value}\"}}{rest}"),
    }
}

/// `GET /metrics` from `addr` (a `sparta ps` or `sparta worker --metrics-listen` address):
/// the body of a 200 answer. HTTP/1.0, so the server closes the connection after the body.
pub fn fetch(addr: SocketAddr, timeout: Duration) -> Result<String, ProtoError> {
    let io = |what: &str, source| ProtoError::Io {
        what: format!("{what} {addr}/metrics"),
        source,
    };
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| io("connecting to", e))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(|e| io("setting timeouts for", e))?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(|e| io("asking", e))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| io("reading", e))?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| ProtoError::Endpoint(format!("{addr}/metrics: no HTTP answer")))?;
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(ProtoError::Endpoint(format!(
            "{addr}/metrics answered {status:?}"
        )));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(p: &str, t: &str) -> (String, String) {
        (p.to_string(), t.to_string())
    }

    #[test]
    fn families_are_declared_once_and_every_sample_names_its_process() {
        let ps = "# HELP sparta_rpc_requests Requests.\n# TYPE sparta_rpc_requests counter\n\
                  sparta_rpc_requests_total{role=\"ps\",rpc=\"pull\"} 7\n\
                  # HELP sparta_uptime_seconds Up.\n# TYPE sparta_uptime_seconds gauge\n\
                  sparta_uptime_seconds{role=\"ps\"} 1.5\n# EOF\n";
        let w = "# HELP sparta_rpc_requests Requests.\n# TYPE sparta_rpc_requests counter\n\
                 sparta_rpc_requests_total{role=\"worker\",rpc=\"pull\"} 9\n\
                 # HELP sparta_train_step Steps.\n# TYPE sparta_train_step gauge\n\
                 sparta_train_step 12\nsparta_empty{} 1\n# EOF\n";
        let merged = merge(&[source("ps0", ps), source("w0", w)]);
        let want = "# HELP sparta_rpc_requests Requests.\n# TYPE sparta_rpc_requests counter\n\
                    sparta_rpc_requests_total{process=\"ps0\",role=\"ps\",rpc=\"pull\"} 7\n\
                    sparta_rpc_requests_total{process=\"w0\",role=\"worker\",rpc=\"pull\"} 9\n\
                    # HELP sparta_uptime_seconds Up.\n# TYPE sparta_uptime_seconds gauge\n\
                    sparta_uptime_seconds{process=\"ps0\",role=\"ps\"} 1.5\n\
                    # HELP sparta_train_step Steps.\n# TYPE sparta_train_step gauge\n\
                    sparta_train_step{process=\"w0\"} 12\n\
                    sparta_empty{process=\"w0\"} 1\n# EOF\n";
        assert_eq!(merged, want);
    }

    #[test]
    fn a_real_registry_merges_into_one_family_per_metric() {
        let a = crate::metrics::Metrics::new("ps").render();
        let b = crate::metrics::Metrics::new("worker").render();
        let merged = merge(&[source("ps0", &a), source("w0", &b)]);
        let types = merged
            .lines()
            .filter(|l| l.starts_with("# TYPE sparta_rpc_requests_total "))
            .count();
        assert_eq!(types, 1, "{merged}");
        // The classic text format (0.0.4) has no `# EOF`; none is added.
        assert_eq!(
            merged.matches("# EOF").count(),
            usize::from(a.contains("# EOF"))
        );
        for l in merged.lines().filter(|l| !l.starts_with('#')) {
            assert!(l.contains("{process=\""), "{l}");
        }
    }
}

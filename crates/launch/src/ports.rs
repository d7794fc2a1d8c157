//! Free loopback ports for processes that bind them later.
//!
//! A port found free by binding port 0 comes from the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`), which is also where every outgoing connection on the host
//! takes its local port: between releasing the probe and the child's bind, any connect() on
//! the machine may take it (seen in CI: a PS of a replicated test failing with "Address already
//! in use" while other tests' clusters connected). The ports here come from below that range,
//! which the kernel never hands out by itself; each is probed by binding it, and all `n` are
//! held together while probing, so they are distinct.

use std::net::TcpListener;

/// The lowest port handed out: above the registered services commonly found on a host.
const FIRST: u16 = 10_000;

/// `n` loopback addresses (`127.0.0.1:port`) free now, below the ephemeral range, the scan
/// starting at a place chosen by `seed` (callers that probe concurrently pass different seeds
/// so that they rarely probe the same ports; a port bound in between is skipped).
pub fn free_loopback(n: usize, seed: u64) -> std::io::Result<Vec<String>> {
    let end = ephemeral_start().unwrap_or(32_768).max(FIRST + 1_000);
    let span = u64::from(end - FIRST);
    let mut held = Vec::with_capacity(n);
    for i in 0..span {
        if held.len() == n {
            break;
        }
        let port = FIRST + ((seed.wrapping_add(i)) % span) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    if held.len() < n {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!(
                "only {} of {n} loopback ports below {end} are free",
                held.len()
            ),
        ));
    }
    held.iter()
        .map(|l| l.local_addr().map(|a| a.to_string()))
        .collect()
}

/// A seed for [`free_loopback`] that differs between calls and processes.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// The first port of the kernel's ephemeral range, where Linux says.
fn ephemeral_start() -> Option<u16> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_below_the_ephemeral_range() {
        let addrs = free_loopback(8, random_seed()).unwrap();
        let end = ephemeral_start().unwrap_or(32_768);
        let mut ports: Vec<u16> = addrs
            .iter()
            .map(|a| a.rsplit(':').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            ports.iter().all(|&p| (FIRST..end).contains(&p)),
            "{ports:?}"
        );
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 8);
        // Released: each can be bound again.
        for a in &addrs {
            TcpListener::bind(a.as_str()).unwrap();
        }
    }

    #[test]
    fn a_port_in_use_is_skipped() {
        let seed = random_seed();
        let first = free_loopback(1, seed).unwrap().remove(0);
        let _taken = TcpListener::bind(first.as_str()).unwrap();
        let again = free_loopback(1, seed).unwrap().remove(0);
        assert_ne!(first, again);
    }
}

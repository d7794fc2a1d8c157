//! [`Ring::allreduce`]: the average of every rank's vector, on every rank, bit-identical.
//!
//! With `n` ranks the vector is cut into `n` near-equal chunks. **Reduce-scatter**: in step
//! `s` (of `n - 1`) rank `r` sends chunk `r - s` to the next rank and adds the chunk `r - s - 1`
//! it receives from the previous one to its own; afterwards rank `r` holds the complete sum of
//! chunk `r + 1`, which it divides by `n` and rounds to the wire type. **All-gather**: in step
//! `s` rank `r` sends chunk `r + 1 - s` and overwrites chunk `r - s` with what it receives.
//! Each step sends on a scoped thread while this thread receives, so a chunk larger than the
//! socket buffers cannot deadlock the ring.

use std::io::{Read, Write};

/// One end of a ring link: a TCP stream, or TLS over one.
pub trait Link: Read + Write + Send {}

impl<T: Read + Write + Send> Link for T {}

use crate::wire::{decode, encode, frame_len, Compression};
use crate::RingError;

/// A formed ring (see [`crate::form_ring`]), one per worker.
pub struct Ring {
    rank: usize,
    size: usize,
    compression: Compression,
    /// To rank `rank + 1` (none for a ring of one): a TCP stream, or TLS over one.
    next: Option<Box<dyn Link>>,
    /// From rank `rank - 1`.
    prev: Option<Box<dyn Link>>,
    /// Calls made (every frame carries it).
    calls: u64,
    /// Bytes this rank sent, over all calls.
    sent: u64,
    /// Bytes this rank received, over all calls.
    received: u64,
    send_buf: Vec<u8>,
    recv_buf: Vec<u8>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("compression", &self.compression)
            .field("calls", &self.calls)
            .finish()
    }
}

/// Start of chunk `k` of `n` over `len` values.
fn bound(len: usize, n: usize, k: usize) -> usize {
    (len as u128 * k as u128 / n as u128) as usize
}

impl Ring {
    pub(crate) fn new(
        rank: usize,
        size: usize,
        compression: Compression,
        links: Option<(Box<dyn Link>, Box<dyn Link>)>,
    ) -> Ring {
        let (next, prev) = match links {
            Some((n, p)) => (Some(n), Some(p)),
            None => (None, None),
        };
        Ring {
            rank,
            size,
            compression,
            next,
            prev,
            calls: 0,
            sent: 0,
            received: 0,
            send_buf: Vec::new(),
            recv_buf: Vec::new(),
        }
    }

    /// This worker's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the ring.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The compression of the values on the wire.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Bytes this rank has sent so far (headers included).
    pub fn bytes_sent(&self) -> u64 {
        self.sent
    }

    /// Bytes this rank has received so far (headers included).
    pub fn bytes_received(&self) -> u64 {
        self.received
    }

    /// Replaces `values` on every rank with the average of all ranks' `values` (same length
    /// on every rank, or the call fails with a protocol error). Blocks until the ring is done;
    /// a dead or silent neighbour fails it with [`RingError::Link`].
    pub fn allreduce(&mut self, values: &mut [f32]) -> Result<(), RingError> {
        let n = self.size;
        self.calls += 1;
        if n == 1 {
            return Ok(());
        }
        let (r, len) = (self.rank, values.len());
        let chunk = |k: usize| bound(len, n, k)..bound(len, n, k + 1);
        for s in 0..n - 1 {
            let (send, recv) = ((r + n - s) % n, (r + 2 * n - s - 1) % n);
            self.exchange(values, chunk(send), chunk(recv), |acc, got| *acc += got)?;
        }
        let own = chunk((r + 1) % n);
        let inv = n as f32;
        for v in &mut values[own.clone()] {
            *v /= inv;
        }
        self.compression.round(&mut values[own]);
        for s in 0..n - 1 {
            let (send, recv) = ((r + 1 + n - s) % n, (r + n - s) % n);
            self.exchange(values, chunk(send), chunk(recv), |acc, got| *acc = got)?;
        }
        Ok(())
    }

    /// Sends `values[send]` to the next rank while receiving the previous rank's frame for
    /// `values[recv]`, then combines it in with `op`.
    fn exchange(
        &mut self,
        values: &mut [f32],
        send: std::ops::Range<usize>,
        recv: std::ops::Range<usize>,
        op: impl Fn(&mut f32, f32),
    ) -> Result<(), RingError> {
        let (call, c) = (self.calls, self.compression);
        encode(call, c, &values[send], &mut self.send_buf);
        let want = frame_len(c, recv.len());
        self.recv_buf.resize(want, 0);
        let (next, prev) = (
            self.next.as_mut().expect("links of a ring of 2+"),
            self.prev.as_mut().expect("links of a ring of 2+"),
        );
        let (rank, size) = (self.rank, self.size);
        let send_buf = &self.send_buf;
        let recv_buf = &mut self.recv_buf;
        let (sent, got) = std::thread::scope(|scope| {
            let writer = scope.spawn(move || next.write_all(send_buf).and_then(|_| next.flush()));
            let got = prev.read_exact(recv_buf);
            (writer.join(), got)
        });
        let link = |what, peer: usize, source| RingError::Link {
            peer: format!("rank {peer}"),
            what,
            source,
        };
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(link("send", (rank + 1) % size, e)),
            Err(_) => {
                return Err(RingError::Protocol(
                    "the ring's sending thread panicked".into(),
                ))
            }
        }
        got.map_err(|e| link("receive", (rank + size - 1) % size, e))?;
        self.sent += self.send_buf.len() as u64;
        self.received += want as u64;
        let dst = &mut values[recv.clone()];
        decode(&self.recv_buf, call, c, recv.len(), |i, v| {
            op(&mut dst[i], v)
        })
    }
}

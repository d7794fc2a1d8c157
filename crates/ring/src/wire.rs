//! Frames on a ring link: a 16-byte header, then the values.
//!
//! Header (little-endian): magic `b"SPRG"`, the call number (`u64`: both sides of a link are
//! at the same [`crate::Ring::allreduce`] call, or the job is broken), the value type (`u8`),
//! 3 bytes of zero, ... then `len` values packed as that type. The payload length follows from
//! the chunk sizes both sides know; it is checked, not trusted.

use half::{bf16, f16};

use crate::RingError;

/// Magic of every frame.
pub const MAGIC: [u8; 4] = *b"SPRG";
/// Bytes of the header.
pub const HEADER: usize = 16;

/// How values travel on the wire (the cluster's one `Compression`, shared with the PS
/// links). Accumulation is always in f32.
pub use sparta_proto::Compression;

/// The compression's code in a frame header.
fn code(c: Compression) -> u8 {
    match c {
        Compression::None => 0,
        Compression::Fp16 => 1,
        Compression::Bf16 => 2,
    }
}

/// Writes the frame of call `call` carrying `values` into `out` (cleared first).
pub fn encode(call: u64, c: Compression, values: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(HEADER + values.len() * c.value_bytes());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&call.to_le_bytes());
    out.push(code(c));
    out.extend_from_slice(&[0, 0, 0]);
    match c {
        Compression::None => {
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Compression::Fp16 => {
            for v in values {
                out.extend_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        Compression::Bf16 => {
            for v in values {
                out.extend_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
    }
}

/// Bytes of a frame of `n` values.
pub fn frame_len(c: Compression, n: usize) -> usize {
    HEADER + n * c.value_bytes()
}

/// Checks a frame's header against the expected call and type and hands its values to `f`
/// one by one (as f32), in order.
pub fn decode(
    frame: &[u8],
    call: u64,
    c: Compression,
    n: usize,
    mut f: impl FnMut(usize, f32),
) -> Result<(), RingError> {
    if frame.len() != frame_len(c, n) {
        return Err(RingError::Protocol(format!(
            "frame of {} bytes, expected {} ({n} values)",
            frame.len(),
            frame_len(c, n)
        )));
    }
    if frame[..4] != MAGIC {
        return Err(RingError::Protocol(
            "bad magic: the peer is not a Sparta ring".into(),
        ));
    }
    let got = u64::from_le_bytes(frame[4..12].try_into().expect("8 bytes"));
    if got != call {
        return Err(RingError::Protocol(format!(
            "the peer is at call {got}, this rank at {call}"
        )));
    }
    if frame[12] != code(c) {
        return Err(RingError::Protocol(format!(
            "value type {} on the wire, {} configured (every worker needs the same \
             compression)",
            frame[12],
            code(c)
        )));
    }
    let body = &frame[HEADER..];
    match c {
        Compression::None => {
            for (i, b) in body.chunks_exact(4).enumerate() {
                f(i, f32::from_le_bytes(b.try_into().expect("4 bytes")));
            }
        }
        Compression::Fp16 => {
            for (i, b) in body.chunks_exact(2).enumerate() {
                f(i, f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32());
            }
        }
        Compression::Bf16 => {
            for (i, b) in body.chunks_exact(2).enumerate() {
                f(
                    i,
                    bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip_equals_rounding(values in proptest::collection::vec(-1e4f32..1e4, 0..300),
                                      call in any::<u64>(), which in 0u8..3) {
            let c = [Compression::None, Compression::Fp16, Compression::Bf16][which as usize];
            let mut frame = Vec::new();
            encode(call, c, &values, &mut frame);
            prop_assert_eq!(frame.len(), frame_len(c, values.len()));
            let mut got = vec![0f32; values.len()];
            decode(&frame, call, c, values.len(), |i, v| got[i] = v).unwrap();
            let mut want = values.clone();
            c.round(&mut want);
            prop_assert_eq!(got, want);
        }

        #[test]
        fn decode_never_panics(frame in proptest::collection::vec(any::<u8>(), 0..80), n in 0usize..20) {
            let _ = decode(&frame, 0, Compression::Fp16, n, |_, _| {});
        }
    }

    #[test]
    fn a_frame_of_another_call_or_type_is_refused() {
        let mut frame = Vec::new();
        encode(7, Compression::Fp16, &[1.0, 2.0], &mut frame);
        let e = decode(&frame, 8, Compression::Fp16, 2, |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("call 7"), "{e}");
        let e = decode(&frame, 7, Compression::Bf16, 2, |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("same compression"), "{e}");
        let e = decode(&frame, 7, Compression::Fp16, 3, |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("expected"), "{e}");
    }
}

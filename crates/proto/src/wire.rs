//! Packed little-endian encodings of keys and values (no per-element protobuf encoding).
//!
//! Keys are `u64` LE; values are `f32` LE, or fp16 / bf16 when compression is on (halving the
//! bytes of embedding values at ~3 / ~2 significant decimal digits).

use std::borrow::Cow;

use bytes::Bytes;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::WireError;
use crate::pb as proto;

/// Encoding of float values on the wire: embedding rows and gradients between workers and
/// shards, dense gradient chunks on the all-reduce ring (summed in f32 there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Compression {
    /// 4-byte floats (exact).
    #[default]
    #[cfg_attr(feature = "clap", value(alias = "f32", alias = "fp32"))]
    None,
    /// IEEE half precision (2 bytes; 10-bit mantissa, range ±65504).
    #[cfg_attr(feature = "clap", value(alias = "f16"))]
    Fp16,
    /// bfloat16 (2 bytes; f32's range, 8-bit mantissa).
    Bf16,
}

impl Compression {
    /// Parses `none` (or `f32`, `fp32`), `fp16` (or `f16`) or `bf16`.
    pub fn parse(s: &str) -> Result<Self, WireError> {
        match s {
            "none" | "f32" | "fp32" => Ok(Self::None),
            "fp16" | "f16" => Ok(Self::Fp16),
            "bf16" => Ok(Self::Bf16),
            o => Err(WireError(format!(
                "wire compression {o:?}: expected none, fp16 or bf16"
            ))),
        }
    }

    /// The name [`Compression::parse`] reads: `none`, `fp16` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
        }
    }

    /// Rounds `v` to what the wire carries (identity for `None`).
    pub fn round(self, v: &mut [f32]) {
        match self {
            Self::None => {}
            Self::Fp16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
            Self::Bf16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        }
    }

    /// Bytes per value.
    pub fn value_bytes(self) -> usize {
        match self {
            Self::None => 4,
            Self::Fp16 | Self::Bf16 => 2,
        }
    }

    /// The protobuf enum value.
    pub fn to_proto(self) -> proto::Compression {
        match self {
            Self::None => proto::Compression::None,
            Self::Fp16 => proto::Compression::Fp16,
            Self::Bf16 => proto::Compression::Bf16,
        }
    }

    /// From the protobuf enum's raw value.
    pub fn from_proto(v: i32) -> Result<Self, WireError> {
        match proto::Compression::try_from(v) {
            Ok(proto::Compression::None) => Ok(Self::None),
            Ok(proto::Compression::Fp16) => Ok(Self::Fp16),
            Ok(proto::Compression::Bf16) => Ok(Self::Bf16),
            Err(_) => Err(WireError(format!("unknown compression {v}"))),
        }
    }
}

/// Keys as packed bytes (one copy into the message buffer).
pub fn keys_to_bytes(keys: &[u64]) -> Bytes {
    Bytes::copy_from_slice(bytemuck::cast_slice(keys))
}

/// How many u64 keys a keys field holds (an error unless a whole number).
pub fn key_count(b: &[u8]) -> Result<usize, WireError> {
    if b.len() & 7 != 0 {
        return Err(WireError(format!(
            "keys field holds {} bytes, not a multiple of 8",
            b.len()
        )));
    }
    Ok(b.len() / 8)
}

/// Keys from packed bytes: borrowed when the buffer is 8-byte aligned, copied otherwise.
pub fn keys_from_bytes(b: &[u8]) -> Result<Cow<'_, [u64]>, WireError> {
    key_count(b)?;
    Ok(match bytemuck::try_cast_slice(b) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(b)),
    })
}

/// Values as packed bytes in `c`'s encoding.
pub fn values_to_bytes(v: &[f32], c: Compression) -> Bytes {
    match c {
        Compression::None => Bytes::copy_from_slice(bytemuck::cast_slice(v)),
        Compression::Fp16 => {
            let mut h = vec![f16::ZERO; v.len()];
            h.convert_from_f32_slice(v);
            Bytes::copy_from_slice(bytemuck::cast_slice(&h))
        }
        Compression::Bf16 => {
            let mut h = vec![bf16::ZERO; v.len()];
            h.convert_from_f32_slice(v);
            Bytes::copy_from_slice(bytemuck::cast_slice(&h))
        }
    }
}

/// Decodes packed values into `out`, which must match their count exactly.
pub fn values_into(b: &[u8], c: Compression, out: &mut [f32]) -> Result<(), WireError> {
    let want = out.len() * c.value_bytes();
    if b.len() != want {
        return Err(WireError(format!(
            "values field holds {} bytes, expected {} ({} values as {:?})",
            b.len(),
            want,
            out.len(),
            c
        )));
    }
    match c {
        Compression::None => match bytemuck::try_cast_slice::<u8, f32>(b) {
            Ok(s) => out.copy_from_slice(s),
            Err(_) => bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(b),
        },
        Compression::Fp16 => {
            let h: Vec<f16> = bytemuck::pod_collect_to_vec(b);
            h.convert_to_f32_slice(out);
        }
        Compression::Bf16 => {
            let h: Vec<bf16> = bytemuck::pod_collect_to_vec(b);
            h.convert_to_f32_slice(out);
        }
    }
    Ok(())
}

/// Decodes packed values into a new vector of `n` values.
pub fn values_to_vec(b: &[u8], c: Compression, n: usize) -> Result<Vec<f32>, WireError> {
    let mut out = vec![0.0; n];
    values_into(b, c, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_even_unaligned() {
        let keys = [1u64, u64::MAX, 0x0102_0304_0506_0708];
        let b = keys_to_bytes(&keys);
        assert_eq!(keys_from_bytes(&b).unwrap().as_ref(), &keys);
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&b);
        assert_eq!(keys_from_bytes(&shifted[1..]).unwrap().as_ref(), &keys);
        assert!(keys_from_bytes(&shifted[..5]).is_err());
    }

    #[test]
    fn values_round_trip_per_compression() {
        let v = [0.0f32, 1.5, -0.031_25, 1234.0, 1e-3];
        for (c, tol) in [
            (Compression::None, 0.0f32),
            (Compression::Fp16, 1e-3),
            (Compression::Bf16, 8e-3),
        ] {
            let b = values_to_bytes(&v, c);
            assert_eq!(b.len(), v.len() * c.value_bytes());
            let back = values_to_vec(&b, c, v.len()).unwrap();
            for (a, r) in v.iter().zip(&back) {
                assert!(
                    (a - r).abs() <= tol * a.abs().max(1e-3),
                    "{c:?}: {a} vs {r}"
                );
            }
            assert!(values_to_vec(&b, c, v.len() + 1).is_err());
        }
    }

    mod props {
        use super::super::*;
        use crate::pb;
        use proptest::prelude::*;
        use prost::Message;

        proptest! {
            /// Keys and exact values survive a whole protobuf message, at any alignment.
            #[test]
            fn push_requests_round_trip(
                keys in proptest::collection::vec(any::<u64>(), 0..200),
                dims in proptest::collection::vec(1usize..9, 1..3),
                seed in any::<u32>(),
            ) {
                let tables: Vec<pb::TableGrads> = dims.iter().enumerate().map(|(t, &dim)| {
                    let v: Vec<f32> = (0..keys.len() * dim)
                        .map(|i| f32::from_bits(seed.wrapping_add((i as u32).wrapping_mul(2_654_435_761)) & 0xBF7F_FFFF))
                        .collect();
                    pb::TableGrads {
                        table: t as u32,
                        dim: dim as u32,
                        grads: values_to_bytes(&v, Compression::None),
                        classes: (seed as u64) << t,
                    }
                }).collect();
                let req = pb::PushRequest {
                    keys: keys_to_bytes(&keys),
                    tables: tables.clone(),
                    compression: Compression::None.to_proto() as i32,
                    class_offsets: vec![0, keys.len() as u32 / 2, keys.len() as u32],
                    id: Some(pb::PushId { rank: 3, session: u64::from(seed) << 20, seq: keys.len() as u64 }),
                    steps: seed % 5,
                };
                let back = pb::PushRequest::decode(req.encode_to_vec().as_slice()).unwrap();
                let got = keys_from_bytes(&back.keys).unwrap().into_owned();
                prop_assert_eq!(got, keys.clone());
                prop_assert_eq!(&back.class_offsets, &req.class_offsets);
                prop_assert_eq!(back.id, req.id);
                prop_assert_eq!(back.steps, req.steps);
                for (a, b) in tables.iter().zip(&back.tables) {
                    let n = keys.len() * a.dim as usize;
                    let va = values_to_vec(&a.grads, Compression::None, n).unwrap();
                    let vb = values_to_vec(&b.grads, Compression::None, n).unwrap();
                    prop_assert!(va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()));
                }
            }

            /// Compressed values stay within the format's relative precision.
            #[test]
            fn compressed_values_keep_their_precision(
                v in proptest::collection::vec(-1e4f32..1e4, 0..300),
            ) {
                for (c, tol) in [(Compression::Fp16, 1e-3f32), (Compression::Bf16, 8e-3)] {
                    let back = values_to_vec(&values_to_bytes(&v, c), c, v.len()).unwrap();
                    for (a, r) in v.iter().zip(&back) {
                        prop_assert!((a - r).abs() <= tol * a.abs().max(1e-4), "{:?}: {} vs {}", c, a, r);
                    }
                }
            }
        }
    }
}

//! PS wire decoding: the first byte picks a gRPC message type; the rest is decoded with prost
//! as the server or the worker would receive it, then its packed fields go through
//! `sparta_proto::wire` (keys, values in each compression) and its JSON fields through the types
//! the coordinator reads them as. Decoding never panics; what decodes re-encodes to a message
//! that decodes and encodes to the same bytes, and packed keys and values round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use sparta_proto::pb;
use sparta_proto::wire::{self, Compression};

/// Decodes `bytes` as `M`; when it decodes, checks that re-encoding round-trips: the
/// re-encoded message decodes to one that encodes to the same bytes (compared as bytes, not
/// values: a float field holding NaN is not equal to itself, yet travels bit for bit).
fn decode<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let encoded = m.encode_to_vec();
    let again = M::decode(encoded.as_slice()).expect("a re-encoded message decodes");
    assert_eq!(again.encode_to_vec(), encoded, "re-encoding changes the message");
    Some(m)
}

/// Keys as the server reads them; round-trips to the same bytes.
fn keys(b: &[u8]) -> Option<usize> {
    let k = wire::keys_from_bytes(b).ok()?;
    assert_eq!(wire::keys_to_bytes(&k).as_ref(), b, "keys round-trip");
    Some(k.len())
}

/// Packed values of `compression` (raw enum value) holding `n` values, as the server and the
/// client decode them: exactly `n * value_bytes` bytes decode, anything else is an error.
fn values(b: &[u8], compression: i32, n: usize) {
    let Ok(c) = Compression::from_proto(compression) else {
        return;
    };
    let fits = b.len() == n * c.value_bytes();
    match wire::values_to_vec(b, c, n) {
        Ok(v) => {
            assert!(fits, "{} bytes decoded as {n} {c:?} values", b.len());
            assert_eq!(v.len(), n);
            if c == Compression::None {
                assert_eq!(
                    wire::values_to_bytes(&v, c).as_ref(),
                    b,
                    "f32 values round-trip"
                );
            }
        }
        Err(_) => assert!(!fits, "{} bytes of {n} {c:?} values refused", b.len()),
    }
}

/// Values a field of unknown count holds (`len / value_bytes`, as the dense RPCs do).
fn all_values(b: &[u8], compression: i32) {
    if let Ok(c) = Compression::from_proto(compression) {
        values(b, compression, b.len() / c.value_bytes());
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    match pick % 8 {
        0 => {
            if let Some(r) = decode::<pb::PullRequest>(bytes) {
                keys(&r.keys);
                let _ = Compression::from_proto(r.compression);
            }
        }
        1 => {
            if let Some(r) = decode::<pb::PushRequest>(bytes) {
                if let Some(n) = keys(&r.keys) {
                    for t in &r.tables {
                        // The server's count: keys of the table's classes times its dim.
                        if let Some(m) = n.checked_mul(t.dim as usize).filter(|&m| m <= 1 << 22) {
                            values(&t.grads, r.compression, m);
                        }
                    }
                }
            }
        }
        2 => {
            if let Some(r) = decode::<pb::PullResponse>(bytes) {
                for v in &r.values {
                    all_values(v, r.compression);
                }
            }
        }
        3 => {
            if let Some(r) = decode::<pb::DenseInitRequest>(bytes) {
                all_values(&r.values, 0);
            }
        }
        4 => {
            if let Some(r) = decode::<pb::DensePushPullRequest>(bytes) {
                all_values(&r.grads, 0);
            }
        }
        5 => {
            if let Some(r) = decode::<pb::DenseResponse>(bytes) {
                all_values(&r.values, 0);
            }
        }
        6 => {
            if let Some(r) = decode::<pb::CheckpointResponse>(bytes) {
                // What worker 0 reads from every shard's answer.
                let _ = serde_json::from_str::<Vec<sparta_checkpoint::PartEntry>>(&r.parts_json);
                let _ = serde_json::from_str::<Vec<sparta_checkpoint::TableEntry>>(&r.tables_json);
                let _ = serde_json::from_str::<Vec<sparta_export::TableFile>>(&r.export_json);
                all_values(&r.export_dense, 0);
            }
        }
        _ => {
            let _ = decode::<pb::CheckpointRequest>(bytes);
            let _ = decode::<pb::InfoResponse>(bytes);
            let _ = decode::<pb::WorkerDoneRequest>(bytes);
        }
    }
});

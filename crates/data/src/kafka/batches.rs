//! The record batches of a fetch answer: cut at their frames (a batch cut short at the end of
//! the answer is left for the next fetch, which asks for at least its size), checked and
//! decompressed by `kafka-protocol` (CRC-32C, magic 2, gzip/snappy/lz4/zstd), and control
//! batches read as transaction markers.
//!
//! A batch that cannot be read (a bad CRC, an unknown codec, a corrupt frame or record, a
//! control record without its key, an old message format) is an error naming its offset:
//! fetching it again returns the same bytes.

use bytes::{Buf, Bytes};
use kafka_protocol::records::RecordBatchDecoder;

/// The bytes before a batch's length is known: base offset (8) and length (4).
const FRAME_HEAD: usize = 12;

/// The smallest batch of magic 2: the fixed header up to the record count.
const BATCH_HEAD: usize = 61;

/// The bytes up to the magic byte (any message format has them).
const MAGIC_END: usize = 17;

/// What a control batch says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// The producer's open transaction on this partition is committed.
    Commit,
    /// The producer's open transaction on this partition is aborted.
    Abort,
    /// Another control record (not about transactions): nothing to do.
    Other(i16),
}

/// What a batch holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    /// Data records: `(offset, value)`.
    Records(Vec<(i64, Option<Bytes>)>),
    /// A control record at this offset.
    Control(i64, Control),
}

/// One record batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Its first offset.
    pub base: i64,
    /// The offset after its last offset (also past records that compaction removed).
    pub next: i64,
    /// The writing producer's id when the batch is part of a transaction.
    pub transaction: Option<i64>,
    pub content: Content,
}

/// The batches of one partition's fetch answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub batches: Vec<Batch>,
    /// The size of a batch cut short at the end (none of it is in `batches`).
    pub cut_short: Option<usize>,
}

/// A batch that cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BadBatch {
    /// The batch's base offset.
    pub offset: i64,
    pub reason: String,
}

/// Decodes a fetch answer's record bytes.
pub(crate) fn decode(mut bytes: Bytes) -> Result<Decoded, BadBatch> {
    let mut out = Decoded::default();
    while bytes.has_remaining() {
        if bytes.len() < FRAME_HEAD {
            out.cut_short = Some(FRAME_HEAD);
            break;
        }
        let base = i64::from_be_bytes(bytes[..8].try_into().unwrap_or_default());
        let len = i32::from_be_bytes(bytes[8..12].try_into().unwrap_or_default());
        let bad = |reason: String| BadBatch {
            offset: base,
            reason,
        };
        let size = usize::try_from(len)
            .ok()
            .map(|l| l + FRAME_HEAD)
            .filter(|&s| s >= MAGIC_END)
            .ok_or_else(|| bad(format!("a record batch of length {len}")))?;
        if bytes.len() < size {
            out.cut_short = Some(size);
            break;
        }
        let batch = bytes.split_to(size);
        out.batches.push(batch_of(base, batch).map_err(bad)?);
    }
    Ok(out)
}

/// One whole batch (its frame included).
fn batch_of(base: i64, bytes: Bytes) -> Result<Batch, String> {
    let magic = bytes[16] as i8;
    if magic != 2 {
        return Err(format!(
            "message format v{magic} (written before Kafka 0.11) is not read: only record batches (v2)"
        ));
    }
    if bytes.len() < BATCH_HEAD {
        return Err(format!("a record batch of {} bytes", bytes.len()));
    }
    let attributes = i16::from_be_bytes([bytes[21], bytes[22]]);
    let last_delta = i32::from_be_bytes(bytes[23..27].try_into().unwrap_or_default());
    let producer = i64::from_be_bytes(bytes[43..51].try_into().unwrap_or_default());
    let transactional = attributes & (1 << 4) != 0;
    let control = attributes & (1 << 5) != 0;
    if last_delta < 0 {
        return Err(format!(
            "a record batch whose last offset delta is {last_delta}"
        ));
    }
    let next = base
        .checked_add(i64::from(last_delta) + 1)
        .ok_or_else(|| format!("a record batch past the last offset ({base} + {last_delta})"))?;
    let mut buf = bytes;
    let set = RecordBatchDecoder::decode(&mut buf).map_err(super::wire::text)?;
    let content = if control {
        let [r] = set.records.as_slice() else {
            return Err(format!(
                "a control batch of {} records (expected 1)",
                set.records.len()
            ));
        };
        Content::Control(r.offset, control_of(r.key.as_deref())?)
    } else {
        Content::Records(
            set.records
                .into_iter()
                .map(|r| (r.offset, r.value))
                .collect(),
        )
    };
    Ok(Batch {
        base,
        next,
        transaction: transactional.then_some(producer),
        content,
    })
}

/// A control record's key: version (i16), type (i16; 0 abort, 1 commit).
fn control_of(key: Option<&[u8]>) -> Result<Control, String> {
    match key {
        Some([_, _, t0, t1, ..]) => Ok(match i16::from_be_bytes([*t0, *t1]) {
            0 => Control::Abort,
            1 => Control::Commit,
            other => Control::Other(other),
        }),
        Some(k) => Err(format!(
            "a control record whose key is {} bytes (expected version and type)",
            k.len()
        )),
        None => Err("a control record without a key".into()),
    }
}

/// Record batches built from parts: the tests' batches and the fuzz targets' answers.
pub(crate) mod build {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    /// One record of a batch at `offset` (`producer`: transactional when set).
    pub fn record(offset: i64, value: Option<&[u8]>, producer: Option<i64>) -> Record {
        Record {
            transactional: producer.is_some(),
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: producer.unwrap_or(-1),
            producer_epoch: if producer.is_some() { 0 } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset,
            // Constant offset - sequence keeps every record in one batch.
            sequence: offset as i32,
            timestamp: 1_700_000_000_000,
            key: None,
            value: value.map(Bytes::copy_from_slice),
            headers: Default::default(),
        }
    }

    /// A control record (a transaction marker) of `producer` at `offset`.
    pub fn marker(offset: i64, producer: i64, commit: bool) -> Record {
        let mut r = record(offset, Some(&[0, 0, 0, 0, 0, 0]), Some(producer));
        r.control = true;
        r.key = Some(Bytes::from(vec![0, 0, 0, u8::from(commit)]));
        r
    }

    /// The bytes of one batch of `records` with `codec`.
    pub fn encode(records: &[Record], codec: Compression) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression: codec,
            },
        )
        .unwrap();
        buf.freeze()
    }

    /// A fetch answer's record bytes built from arbitrary `input` (for the fuzz targets):
    /// consecutive batches of every codec, plain or transactional, markers of either fate,
    /// then a few bytes of the result flipped where the input's tail says.
    pub fn answer(input: &[u8]) -> Vec<u8> {
        const CODECS: [Compression; 5] = [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ];
        let mut out = BytesMut::new();
        let mut offset = 0i64;
        // 4 bytes a batch (kind, records, codec, producer) until a kind 0xff or the
        // input's end; what follows says which bytes to flip.
        let mut at = 0;
        while let Some(&[kind, n, codec, producer]) = input.get(at..at + 4) {
            at += 4;
            if kind == 0xff {
                break;
            }
            let producer = i64::from(producer % 3);
            let records: Vec<Record> = match kind % 4 {
                0 | 1 => (0..i64::from(n % 16 + 1))
                    .map(|i| {
                        let o = offset + i;
                        let p = (kind % 4 == 1).then_some(producer);
                        record(o, Some(format!("1\t{o}").as_bytes()), p)
                    })
                    .collect(),
                k => vec![marker(offset, producer, k == 2)],
            };
            offset += records.len() as i64;
            out.extend_from_slice(&encode(&records, CODECS[usize::from(codec) % 5]));
        }
        let flips = input.get(at..).unwrap_or_default();
        let mut out = out.to_vec();
        for f in flips.chunks(3) {
            if let (&[a, b, x], false) = (f, out.is_empty()) {
                let at = usize::from(u16::from_le_bytes([a, b])) % out.len();
                out[at] ^= x;
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{Compression, Record};
    use proptest::prelude::*;

    pub const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    pub use super::build::{encode, marker, record};

    #[test]
    fn a_built_answer_decodes_to_its_batches_and_a_flipped_one_never_panics() {
        // Plain (3 records, lz4), transactional (2, zstd) of producer 1, its commit marker.
        let spec = [0, 2, 3, 0, 1, 1, 4, 1, 2, 0, 0, 1];
        let d = decode(build::answer(&spec).into()).unwrap();
        let parts: Vec<_> = d
            .batches
            .iter()
            .map(|b| (b.base, b.next, b.transaction))
            .collect();
        assert_eq!(parts, [(0, 3, None), (3, 5, Some(1)), (5, 6, Some(1))]);
        assert_eq!(d.batches[2].content, Content::Control(5, Control::Commit));
        for at in 0..200u8 {
            let mut flipped = spec.to_vec();
            flipped.extend([0xff, at, 0, 0x5a]);
            let _ = decode(build::answer(&flipped).into());
        }
    }

    fn values(n: i64, from: i64) -> Vec<Record> {
        (from..from + n)
            .map(|o| record(o, Some(format!("line {o}").as_bytes()), None))
            .collect()
    }

    #[test]
    fn every_codec_decodes_to_the_records_written() {
        for codec in CODECS {
            let d = decode(encode(&values(50, 7), codec)).unwrap();
            assert_eq!(d.cut_short, None);
            let [b] = d.batches.as_slice() else {
                panic!("{codec:?}: {d:?}")
            };
            assert_eq!((b.base, b.next, b.transaction), (7, 57, None));
            let Content::Records(r) = &b.content else {
                panic!("{codec:?}")
            };
            assert_eq!(r.len(), 50);
            assert_eq!(r[3], (10, Some(Bytes::from("line 10"))), "{codec:?}");
        }
    }

    #[test]
    fn a_batch_cut_short_at_the_end_is_left_with_its_size() {
        let one = encode(&values(3, 0), Compression::None);
        let two = encode(&values(4, 3), Compression::Lz4);
        let mut all = BytesMut::new();
        all.extend_from_slice(&one);
        all.extend_from_slice(&two[..two.len() - 5]);
        let d = decode(all.freeze()).unwrap();
        assert_eq!(d.batches.len(), 1);
        assert_eq!(d.cut_short, Some(two.len()));
        let d = decode(one.slice(..7)).unwrap();
        assert_eq!((d.batches.len(), d.cut_short), (0, Some(FRAME_HEAD)));
    }

    #[test]
    fn a_bad_crc_names_the_batch_offset() {
        let mut b = BytesMut::from(&encode(&values(5, 40), Compression::Zstd)[..]);
        let last = b.len() - 1;
        b[last] ^= 0x55;
        let e = decode(b.freeze()).unwrap_err();
        assert_eq!(e.offset, 40);
        assert!(e.reason.contains("Cyclic redundancy check failed"), "{e:?}");
    }

    #[test]
    fn an_unknown_codec_is_an_error() {
        let mut b = BytesMut::from(&encode(&values(2, 0), Compression::None)[..]);
        // Codec 6 in the attributes, the CRC written again over the changed bytes.
        b[22] = (b[22] & !7) | 6;
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        let e = decode(b.freeze()).unwrap_err();
        assert!(
            e.reason.contains("Unknown compression algorithm used: 6"),
            "{e:?}"
        );
    }

    #[test]
    fn an_old_message_format_is_named() {
        let mut b = BytesMut::from(&encode(&values(2, 9), Compression::None)[..]);
        b[16] = 1;
        let e = decode(b.freeze()).unwrap_err();
        assert_eq!(e.offset, 9);
        assert!(e.reason.contains("message format v1"), "{e:?}");
    }

    #[test]
    fn control_batches_are_markers_and_a_keyless_one_is_an_error() {
        for (commit, want) in [(true, Control::Commit), (false, Control::Abort)] {
            let d = decode(encode(&[marker(12, 77, commit)], Compression::None)).unwrap();
            assert_eq!(
                d.batches,
                [Batch {
                    base: 12,
                    next: 13,
                    transaction: Some(77),
                    content: Content::Control(12, want)
                }]
            );
        }
        let mut m = marker(3, 1, true);
        m.key = None;
        let e = decode(encode(&[m], Compression::None)).unwrap_err();
        assert_eq!(e.offset, 3);
        assert!(e.reason.contains("control record without a key"), "{e:?}");
        let mut m = marker(3, 1, true);
        m.key = Some(Bytes::from_static(&[0, 0, 0, 5]));
        let d = decode(encode(&[m], Compression::None)).unwrap();
        assert_eq!(d.batches[0].content, Content::Control(3, Control::Other(5)));
    }

    #[test]
    fn a_transactional_batch_carries_its_producer() {
        let recs: Vec<_> = (0..3).map(|o| record(o, Some(b"x"), Some(42))).collect();
        let d = decode(encode(&recs, Compression::Snappy)).unwrap();
        assert_eq!(d.batches[0].transaction, Some(42));
    }

    proptest! {
        /// Batches of any codec, laid end to end, decode to what was written, in order.
        #[test]
        fn batches_of_any_codec_round_trip(
            batches in prop::collection::vec(
                (0usize..5, prop::collection::vec(
                    prop::option::of(prop::collection::vec(any::<u8>(), 0..40)), 1..20)),
                1..6),
        ) {
            let mut all = BytesMut::new();
            let mut want = Vec::new();
            let mut at = 100i64;
            for (codec, vals) in &batches {
                let recs: Vec<Record> = vals
                    .iter()
                    .enumerate()
                    .map(|(i, v)| record(at + i as i64, v.as_deref(), None))
                    .collect();
                all.extend_from_slice(&encode(&recs, CODECS[*codec]));
                for (i, v) in vals.iter().enumerate() {
                    want.push((at + i as i64, v.clone().map(Bytes::from)));
                }
                at += vals.len() as i64;
            }
            let d = decode(all.freeze()).unwrap();
            prop_assert_eq!(d.cut_short, None);
            let got: Vec<_> = d
                .batches
                .into_iter()
                .flat_map(|b| match b.content {
                    Content::Records(r) => r,
                    Content::Control(..) => Vec::new(),
                })
                .collect();
            prop_assert_eq!(got, want);
        }

        /// Any bytes: batches, a batch cut short, or an error; never a panic.
        #[test]
        fn any_bytes_decode_or_fail_without_panic(raw in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(Bytes::from(raw));
        }

        /// One byte changed anywhere after the CRC field is caught.
        #[test]
        fn a_changed_byte_after_the_crc_is_an_error(
            codec in 0usize..5,
            at in 21usize..4096,
            flip in 1u8..=255,
        ) {
            let b = encode(&values(20, 0), CODECS[codec]);
            let at = at % (b.len() - 21) + 21;
            let mut m = BytesMut::from(&b[..]);
            m[at] ^= flip;
            prop_assert!(decode(m.freeze()).is_err());
        }
    }
}

//! Reading event files back (tests, tools): the records with both CRCs checked, and the
//! scalars of the events.

use std::path::Path;

use prost::Message;

use crate::proto::Event;
use crate::record::masked_crc;

/// Why bytes are not a sequence of valid records, at the byte offset of the record.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Bad {
    /// The bytes end inside a record.
    #[error("record at byte {at}: truncated")]
    Truncated {
        /// Offset of the record.
        at: usize,
    },
    /// The length's CRC does not match.
    #[error("record at byte {at}: the length's CRC does not match")]
    LengthCrc {
        /// Offset of the record.
        at: usize,
    },
    /// The data's CRC does not match.
    #[error("record at byte {at}: the data's CRC does not match")]
    DataCrc {
        /// Offset of the record.
        at: usize,
    },
    /// The data is not an `Event`.
    #[error("record at byte {at}: not an Event message")]
    NotAnEvent {
        /// Offset of the record.
        at: usize,
    },
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// The data of every record in `bytes`, in order.
pub fn records(bytes: &[u8]) -> Result<Vec<Vec<u8>>, Bad> {
    Ok(spans(bytes)?.into_iter().map(|(_, d)| d.to_vec()).collect())
}

/// Every record's offset and data.
fn spans(bytes: &[u8]) -> Result<Vec<(usize, &[u8])>, Bad> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len_bytes = bytes.get(at..at + 8).ok_or(Bad::Truncated { at })?;
        let crc = u32_at(bytes, at + 8).ok_or(Bad::Truncated { at })?;
        if crc != masked_crc(len_bytes) {
            return Err(Bad::LengthCrc { at });
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        let start = at + 12;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| start.checked_add(l))
            .ok_or(Bad::Truncated { at })?;
        let data = bytes.get(start..end).ok_or(Bad::Truncated { at })?;
        let crc = u32_at(bytes, end).ok_or(Bad::Truncated { at })?;
        if crc != masked_crc(data) {
            return Err(Bad::DataCrc { at });
        }
        out.push((at, data));
        at = end + 4;
    }
    Ok(out)
}

/// Every event in `bytes`, in order.
pub fn events(bytes: &[u8]) -> Result<Vec<Event>, Bad> {
    spans(bytes)?
        .into_iter()
        .map(|(at, d)| Event::decode(d).map_err(|_| Bad::NotAnEvent { at }))
        .collect()
}

/// One scalar of an event file.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    /// Its series.
    pub tag: String,
    /// Its step.
    pub step: i64,
    /// Its value.
    pub value: f32,
}

/// Every scalar of the event file at `path`, in file order.
pub fn scalars(path: &Path) -> Result<Vec<Scalar>, crate::BoardError> {
    let bytes = std::fs::read(path).map_err(|source| crate::BoardError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let events = events(&bytes).map_err(|bad| crate::BoardError::Corrupt {
        path: path.to_path_buf(),
        bad,
    })?;
    Ok(events
        .iter()
        .filter_map(|e| Some((e.step, e.summary.as_ref()?)))
        .flat_map(|(step, s)| {
            s.value.iter().filter_map(move |v| {
                Some(Scalar {
                    tag: v.tag.clone(),
                    step,
                    value: v.simple_value?,
                })
            })
        })
        .collect())
}

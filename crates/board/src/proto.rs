//! The `Event` and `Summary` messages TensorBoard reads scalars from, written by hand with
//! `prost`'s derive (no `.proto` compilation): only the fields this crate writes, with the
//! field numbers of `tensorflow/core/util/event.proto` and
//! `tensorflow/core/framework/summary.proto`. A `oneof` member is an `optional` field here:
//! the same bytes on the wire, and a zero is still written (a scalar of 0.0 stays a value).

/// `tensorflow.Event`: one record of an event file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch when the event was written.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step of a summary.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// The first record of a file: `brain.Event:2`.
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// Summary values (scalars).
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary`: values logged at one step.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`: one tagged value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    /// The series it belongs to, e.g. `train/rows`.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A scalar.
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// The file version TensorBoard expects in the first record.
pub const FILE_VERSION: &str = "brain.Event:2";

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn a_scalar_event_has_the_field_numbers_of_event_proto() {
        let e = Event {
            wall_time: 1.5,
            step: 3,
            file_version: None,
            summary: Some(Summary {
                value: vec![SummaryValue {
                    tag: "a".into(),
                    simple_value: Some(0.0),
                }],
            }),
        };
        let bytes = e.encode_to_vec();
        // Field 1, 64-bit; field 2, varint;
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 3]);
        // field 5, length 10: Summary { field 1, length 8: Value { tag "a", simple_value 0.0 } }
        want.extend_from_slice(&[0x2a, 10, 0x0a, 8, 0x0a, 1, b'a', 0x15]);
        want.extend_from_slice(&0.0f32.to_le_bytes());
        assert_eq!(bytes, want);
    }

    #[test]
    fn the_version_event_carries_field_3() {
        let e = Event {
            wall_time: 0.0,
            step: 0,
            file_version: Some(FILE_VERSION.into()),
            summary: None,
        };
        let mut want = vec![0x1a, FILE_VERSION.len() as u8];
        want.extend_from_slice(FILE_VERSION.as_bytes());
        assert_eq!(e.encode_to_vec(), want);
    }
}

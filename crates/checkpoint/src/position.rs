//! The worker's input position: saved in every checkpoint's manifest (and in each worker's
//! entry of a cluster checkpoint), returned by a restore.

use serde::{Deserialize, Serialize};

/// Where the worker's input stands, so training resumes on the next unread example.
///
/// A job reading a list of files saves `rows_consumed`; a job following a directory saves the
/// name of the file being read in `file` and the offset of its next unread line in
/// `byte_offset`; a job reading a Kafka topic saves the topic and the next offset of every
/// partition. Manifests written before `file` (or `topic`, `kafka`) existed read them as empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputPosition {
    /// Pass over the input files.
    pub epoch: u64,
    /// Index of the file being read.
    pub file_index: u64,
    /// Byte offset of the next unread line in that file.
    pub byte_offset: u64,
    /// Examples consumed since the start of training.
    pub rows_consumed: u64,
    /// Name of the file being read when following a directory (empty otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// Kafka topic being read (empty otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub topic: String,
    /// Reading a Kafka topic: `(partition, next offset)` for every partition, sorted by
    /// partition; a resume starts each partition at its offset (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kafka: Vec<(i32, i64)>,
    /// Following a directory: the identities of the last files read up to `file` (`file`
    /// last), so a resume tells a file deleted or renamed meanwhile (see
    /// `sparta_data::FollowPosition::recent`; empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub follow_files: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::InputPosition;

    #[test]
    fn positions_without_a_file_name_still_read() {
        let old = r#"{"epoch":1,"file_index":2,"byte_offset":3,"rows_consumed":4}"#;
        let p: InputPosition = serde_json::from_str(old).unwrap();
        assert_eq!(
            (p.byte_offset, p.rows_consumed, p.file.as_str()),
            (3, 4, "")
        );
        let new = InputPosition {
            file: "h01.tsv".into(),
            ..p.clone()
        };
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(serde_json::from_str::<InputPosition>(&text).unwrap(), new);
        assert_eq!(serde_json::to_string(&p).unwrap(), old);
    }
}

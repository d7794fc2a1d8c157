//! An opened Parquet file: its footer, the projection onto the columns the plan reads, and
//! the row ranges the feeder hands to the parsers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use super::columns::{self, Leaf, READ_TYPES};
use super::source::Chunks;
use crate::error::DataError;
use crate::input::{read_full_at, RangeRead, PARQUET_MAGIC};
use crate::parse::LineParser;

/// Rows of one work item at most: a bigger row group is handed out in ranges of this many
/// rows, decoded in parallel. Each range of a group reads the group's dictionary pages again
/// (and, without an offset index, the page headers before its first row, and a list column's
/// pages), so only big groups are cut (`convert` writes 128 Ki-row groups; Arrow's default
/// is 1 Mi rows).
pub(crate) const RANGE_ROWS: usize = 512 << 10;

/// A Parquet file whose footer was read, projected onto the columns a parser asks for.
pub(crate) struct ParquetFile {
    pub path: PathBuf,
    pub source: Arc<dyn RangeRead>,
    pub len: u64,
    /// The footer, with the offset index when the file has one (it lets a range skip the
    /// pages before its first row unread).
    pub meta: ParquetMetaData,
    /// The projected root columns, in file order.
    pub columns: Vec<Projected>,
    /// For each column of the line schema: its index among the projected columns, if read.
    pub column_of: Vec<Option<usize>>,
    /// Bytes read for the footer (and offset index).
    pub footer_bytes: u64,
}

/// A root column that is read.
pub(crate) struct Projected {
    /// Its name (for errors).
    pub name: String,
    pub leaf: Leaf,
    /// The separator its list items are joined with.
    pub sep: u8,
}

impl ParquetFile {
    /// Reads the footer of the `len`-byte Parquet file `source` and finds, by name, the columns
    /// `parser` reads. Errors name the file: not Parquet, corrupt or truncated footer, a column
    /// missing or of a type that is not read.
    pub fn open(
        path: &Path,
        source: Arc<dyn RangeRead>,
        len: u64,
        parser: &LineParser,
    ) -> Result<ParquetFile, DataError> {
        let err = |detail: String| DataError::Parquet {
            path: path.to_path_buf(),
            detail,
        };
        not_parquet(&*source, len).map_err(err)?;
        let chunks = Chunks::new(Arc::clone(&source), len);
        let meta = ParquetMetaDataReader::new()
            .with_column_index_policy(PageIndexPolicy::Skip)
            .with_offset_index_policy(PageIndexPolicy::Optional)
            .parse_and_finish(&chunks)
            .map_err(|e| err(format!("cannot read the footer: {e}")))?;
        let schema = meta.file_metadata().schema_descr();
        let names = parser.column_names();
        let mut found = Vec::new();
        for c in parser.used_columns() {
            let name = &names[c];
            let leaf = columns::find(schema, name)
                .map_err(|t| err(format!("column {name:?} is {t}; {READ_TYPES}")))?
                .ok_or_else(|| err(format!("no column {name:?} (the input plan reads it)")))?;
            found.push((leaf, c));
        }
        found.sort_unstable_by_key(|(leaf, _)| leaf.index);
        let mut column_of = vec![None; names.len()];
        let mut projected = Vec::with_capacity(found.len());
        for (k, (leaf, c)) in found.into_iter().enumerate() {
            column_of[c] = Some(k);
            projected.push(Projected {
                name: names[c].clone(),
                leaf,
                sep: parser.value_separator(c),
            });
        }
        Ok(ParquetFile {
            path: path.to_path_buf(),
            source,
            len,
            meta,
            columns: projected,
            column_of,
            footer_bytes: chunks.bytes_read(),
        })
    }

    /// Rows of the file.
    pub fn num_rows(&self) -> u64 {
        self.meta.file_metadata().num_rows().max(0) as u64
    }

    /// The work items from row `start` on, as `(row group, rows skipped in it, rows taken,
    /// file row of the first taken row)`, in file order. With `part = (index, count)`, only
    /// the `index`-th of `count` near-equal runs of row groups. `Err(why)` if `start` is past
    /// the end of the file.
    pub fn ranges(
        &self,
        start: u64,
        part: Option<(usize, usize)>,
    ) -> Result<Vec<(usize, usize, usize, u64)>, PastEnd> {
        let total = self.num_rows();
        if start > total {
            return Err(PastEnd { start, total });
        }
        let meta = &self.meta;
        let groups = meta.num_row_groups();
        let (lo, hi) = match part {
            Some((index, count)) if count > 1 => {
                (groups * index / count, groups * (index + 1) / count)
            }
            _ => (0, groups),
        };
        let mut out = Vec::new();
        let mut first = 0u64;
        for g in 0..groups {
            let rows = meta.row_group(g).num_rows().max(0) as u64;
            let end = first + rows;
            if (lo..hi).contains(&g) && end > start {
                let mut skip = start.saturating_sub(first) as usize;
                while (skip as u64) < rows {
                    let take = (rows as usize - skip).min(RANGE_ROWS);
                    out.push((g, skip, take, first + skip as u64));
                    skip += take;
                }
            }
            first = end;
        }
        Ok(out)
    }
}

/// A start row past the end of a Parquet file ([`ParquetFile::ranges`]).
#[derive(Debug, thiserror::Error)]
#[error("row {start} is past the end of the file ({total} rows)")]
pub(crate) struct PastEnd {
    /// The start row asked for.
    pub start: u64,
    /// Rows of the file.
    pub total: u64,
}

/// `Err(why)` when the `len`-byte `source` is plainly not a Parquet file: it does not start
/// and end with the `PAR1` magic (a text file named `.parquet`, say). A file that has both
/// but does not decode is left to the footer reader's error.
fn not_parquet(source: &dyn RangeRead, len: u64) -> Result<(), String> {
    let io = |e: std::io::Error| format!("cannot read it: {e}");
    let mut head = [0u8; 64];
    let n = read_full_at(source, &mut head, 0).map_err(io)?;
    let head = &head[..n];
    let mut tail = [0u8; 4];
    let tail_ok = len >= 12
        && read_full_at(source, &mut tail, len - 4).map_err(io)? == 4
        && &tail == PARQUET_MAGIC;
    if head.starts_with(PARQUET_MAGIC) && tail_ok {
        return Ok(());
    }
    let what = if head.starts_with(PARQUET_MAGIC) {
        "it starts with the PAR1 magic but does not end with it (truncated, or still being \
         written)"
            .to_string()
    } else if looks_like_text(head) {
        format!(
            "not a Parquet file: it lacks the PAR1 magic and looks like text ({:?}...)",
            String::from_utf8_lossy(&head[..head.len().min(40)])
        )
    } else {
        format!(
            "not a Parquet file: it lacks the PAR1 magic (its {} bytes start with {:02x?})",
            len,
            &head[..head.len().min(8)]
        )
    };
    Err(what)
}

/// Whether `bytes` (a file's first bytes) look like text: UTF-8 (a character cut at the end
/// allowed) without control bytes other than tab, CR and LF.
fn looks_like_text(bytes: &[u8]) -> bool {
    let valid = match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    };
    valid
        && !bytes.is_empty()
        && bytes
            .iter()
            .all(|&b| b >= 0x20 || matches!(b, b'\t' | b'\n' | b'\r'))
}

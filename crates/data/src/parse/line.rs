//! Cutting a line into its columns: the text path into [`LineParser::parse_values`].

use memchr::memchr;

use super::{BadLine, LineParser, MAX_LINE_BYTES, STACK_COLUMNS};
use crate::batch::BatchBuilder;

/// The UTF-8 byte order mark (U+FEFF) some tools write at the start of a text file.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

impl LineParser {
    /// Parses `line` (without `\n`; a trailing `\r` and a leading UTF-8 byte order mark are
    /// dropped) and appends it as a row. On error nothing is appended.
    pub fn parse_line(&self, line: &[u8], out: &mut BatchBuilder) -> Result<(), BadLine> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // Editors and Windows tools start a UTF-8 file with a BOM: it is not part of the row.
        let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
        if line.len() > MAX_LINE_BYTES {
            return Err(BadLine::TooLong { len: line.len() });
        }
        if std::str::from_utf8(line).is_err() {
            return Err(BadLine::InvalidUtf8);
        }
        let n = self.names.len();
        let mut stack = [(0u32, 0u32); STACK_COLUMNS];
        let mut heap = Vec::new();
        let cols: &mut [(u32, u32)] = if n <= STACK_COLUMNS {
            &mut stack[..n]
        } else {
            heap.resize(n, (0, 0));
            &mut heap
        };
        self.split(line, cols)?;
        self.parse_values(
            |c| {
                let (a, b) = cols[c];
                Some(&line[a as usize..b as usize])
            },
            out,
        )
    }

    /// Cuts `line` into exactly `cols.len()` columns (byte ranges).
    #[inline]
    fn split(&self, line: &[u8], cols: &mut [(u32, u32)]) -> Result<(), BadLine> {
        let expected = cols.len();
        let mut start = 0usize;
        for (i, col) in cols.iter_mut().enumerate().take(expected - 1) {
            match memchr(self.sep, &line[start..]) {
                Some(p) => {
                    *col = (start as u32, (start + p) as u32);
                    start += p + 1;
                }
                None => {
                    return Err(BadLine::TooFewColumns {
                        found: i + 1,
                        expected,
                    })
                }
            }
        }
        let rest = &line[start..];
        if memchr(self.sep, rest).is_some() {
            let extra = memchr::memchr_iter(self.sep, rest).count();
            return Err(BadLine::TooManyColumns {
                found: expected + extra,
                expected,
            });
        }
        cols[expected - 1] = (start as u32, line.len() as u32);
        Ok(())
    }
}

//! A flat (one value per row) `BYTE_ARRAY` or `DOUBLE` column's dictionary-encoded pages,
//! decoded here rather than by the parquet crate, which hands out each string as its own
//! `Bytes` (a reference count taken and dropped per value) and never the keys.
//!
//! The dictionary page becomes a table of entries ([`Entries`]: for strings where each one's
//! bytes are in the page and its [`value_hash`], computed once; for doubles the numbers). A data page (v1 or v2,
//! `RLE_DICTIONARY` / `PLAIN_DICTIONARY`) gives each row its entry: definition levels and
//! keys through [`Hybrid`]; a row's cell is the entry's (bytes with their hash, or the
//! number), missing for a null or an empty string (as the crate's reader gives them). Any other page (a plain page a
//! writer fell back to mid-chunk, another encoding, a second dictionary, a page that is not
//! laid out as expected) hands the rest of the column chunk, from that page on and with the
//! dictionary page seen, to the crate's reader ([`super::strings_column`],
//! [`super::doubles_column`]): values read are the same either way.

use std::collections::VecDeque;

use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::schema::types::ColumnDescPtr;

use super::super::columns::Shape;
use super::super::hybrid::{Hybrid, HybridError};
use super::ColumnCells;
use crate::ids::value_hash;
use crate::parse::Cell;

/// The entries of a dictionary page, and a row's cell of one.
pub(super) trait Entries: Sized {
    /// The `n` entries of a plain dictionary page; `None` when it does not hold them.
    fn of_page(buf: &Bytes, n: u32) -> Option<Self>;
    /// The number of entries: the first key that is not one, a null row's.
    fn null(&self) -> u32;
    /// The cell of a row that holds entry `k` (missing for [`Entries::null`]).
    fn cell(&self, k: u32) -> Cell<'_>;
}

/// A string dictionary entry: its bytes in the dictionary page, and their [`value_hash`] (0
/// for an empty entry, missing).
#[derive(Clone, Copy)]
struct Entry {
    at: u32,
    len: u32,
    hash: u64,
}

/// The entries of a byte-array dictionary page, hashed, and one more, empty, last: a null's.
pub(super) struct ByteEntries {
    page: Bytes,
    entries: Vec<Entry>,
}

impl Entries for ByteEntries {
    fn of_page(buf: &Bytes, n: u32) -> Option<Self> {
        let mut entries = entries_of(buf, n)?;
        // Every entry is hashed: a writer puts in the dictionary only values its rows hold,
        // and a range reads most of a row group's rows.
        for e in entries.iter_mut().filter(|e| e.len > 0) {
            let at = e.at as usize;
            e.hash = value_hash(&buf[at..at + e.len as usize]);
        }
        entries.push(NULL_ENTRY);
        Some(ByteEntries {
            page: buf.clone(),
            entries,
        })
    }

    fn null(&self) -> u32 {
        (self.entries.len() - 1) as u32
    }

    #[inline]
    fn cell(&self, k: u32) -> Cell<'_> {
        let e = self.entries[k as usize];
        let at = e.at as usize;
        match e.len {
            0 => Cell::MISSING,
            len => Cell::Hashed(&self.page[at..at + len as usize], e.hash),
        }
    }
}

/// The numbers of a double dictionary page.
pub(super) struct DoubleEntries(Vec<f64>);

impl Entries for DoubleEntries {
    fn of_page(buf: &Bytes, n: u32) -> Option<Self> {
        let bytes = buf.get(..(n as usize).checked_mul(8)?)?;
        let values = bytes.chunks_exact(8).map(|b| {
            let mut x = [0u8; 8];
            x.copy_from_slice(b);
            f64::from_le_bytes(x)
        });
        Some(DoubleEntries(values.collect()))
    }

    fn null(&self) -> u32 {
        self.0.len() as u32
    }

    #[inline]
    fn cell(&self, k: u32) -> Cell<'_> {
        self.0
            .get(k as usize)
            .map_or(Cell::MISSING, |&x| Cell::Float(x))
    }
}

/// The crate's reader of the rest of a chunk: `(leaf, pages, shape, list separator)`.
pub(super) type Hand = fn(ColumnDescPtr, Box<dyn PageReader>, Shape, u8) -> Box<dyn ColumnCells>;

/// The data page being read.
struct DataPage {
    /// Its definition levels (`None`: a required column).
    defs: Option<Hybrid>,
    keys: Hybrid,
    /// Levels (rows) of the page not read yet.
    left: usize,
}

/// What the next page is.
enum Next {
    /// A data page to read.
    Data,
    /// The end of the chunk.
    End,
    /// The rest of the chunk is the crate reader's.
    Handed,
}

/// A flat column of a row range whose dictionary holds `E` (see the module).
pub(super) struct DictColumn<E: Entries> {
    /// The chunk's pages; `None` once handed to `handed`.
    pages: Option<Box<dyn PageReader>>,
    descr: ColumnDescPtr,
    max_def: i16,
    /// The dictionary page (handed on with the rest of the chunk) and its entries.
    dict_page: Option<Page>,
    entries: Option<E>,
    page: Option<DataPage>,
    /// The entry of each row read here.
    rows: Vec<u32>,
    /// A page's definition levels and keys of the rows being read.
    levels: Vec<u32>,
    keys: Vec<u32>,
    /// The crate's reader of the rest of the chunk (from the page that is not read here),
    /// and what makes it.
    handed: Option<Box<dyn ColumnCells>>,
    hand: Hand,
    sep: u8,
}

impl<E: Entries> DictColumn<E> {
    /// The column of `pages` (the leaf `descr`), a row's value present at level `max_def`;
    /// `hand` makes the crate's reader of the chunk from a page that is not read here.
    pub fn new(
        descr: ColumnDescPtr,
        pages: Box<dyn PageReader>,
        max_def: i16,
        sep: u8,
        hand: Hand,
    ) -> DictColumn<E> {
        DictColumn {
            pages: Some(pages),
            descr,
            max_def,
            dict_page: None,
            entries: None,
            page: None,
            rows: Vec::new(),
            levels: Vec::new(),
            keys: Vec::new(),
            handed: None,
            hand,
            sep,
        }
    }

    /// The entry a null row points to (the number of entries).
    fn null(&self) -> u32 {
        self.entries.as_ref().map_or(0, E::null)
    }

    /// Whether the current data page has no rows left.
    fn page_done(&self) -> bool {
        self.page.as_ref().is_none_or(|p| p.left == 0)
    }

    /// Moves to the next data page (taking up a dictionary page before it), or hands the
    /// chunk on from a page that is not read here.
    fn next_page(&mut self) -> ParquetResult<Next> {
        self.page = None;
        loop {
            let Some(pages) = self.pages.as_mut() else {
                return Ok(Next::Handed);
            };
            let Some(page) = pages.get_next_page()? else {
                return Ok(Next::End);
            };
            match &page {
                Page::DictionaryPage {
                    buf,
                    num_values,
                    encoding: Encoding::PLAIN | Encoding::PLAIN_DICTIONARY,
                    ..
                } if self.dict_page.is_none() => {
                    if let Some(entries) = E::of_page(buf, *num_values) {
                        self.entries = Some(entries);
                        self.dict_page = Some(page);
                        continue;
                    }
                }
                Page::DataPage {
                    buf,
                    num_values,
                    encoding,
                    def_level_encoding,
                    ..
                } if self.dict_page.is_some()
                    && is_dictionary(*encoding)
                    && (self.max_def == 0 || *def_level_encoding == Encoding::RLE) =>
                {
                    if let Some(p) = self.v1(buf, *num_values) {
                        self.page = Some(p);
                        return Ok(Next::Data);
                    }
                }
                Page::DataPageV2 {
                    buf,
                    num_values,
                    encoding,
                    def_levels_byte_len,
                    rep_levels_byte_len,
                    ..
                } if self.dict_page.is_some() && is_dictionary(*encoding) => {
                    let (rep, def) = (*rep_levels_byte_len as usize, *def_levels_byte_len as usize);
                    if let Some(p) = self.v2(buf, *num_values, rep, def) {
                        self.page = Some(p);
                        return Ok(Next::Data);
                    }
                }
                _ => {}
            }
            self.hand_on(page);
            return Ok(Next::Handed);
        }
    }

    /// A v1 data page: `[definition levels: u32 length, hybrid]` (when the column has
    /// them), then the keys; `None` when it is not laid out so.
    fn v1(&self, buf: &Bytes, levels: u32) -> Option<DataPage> {
        let (defs, values) = if self.max_def > 0 {
            let len = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
            let defs = buf.get(4..4 + len).map(|_| buf.slice(4..4 + len))?;
            (Some(defs), buf.slice(4 + len..))
        } else {
            (None, buf.clone())
        };
        self.data_page(defs, values, levels)
    }

    /// A v2 data page: repetition levels (`rep` bytes, none in a flat column), definition
    /// levels (`def` bytes), the keys.
    fn v2(&self, buf: &Bytes, levels: u32, rep: usize, def: usize) -> Option<DataPage> {
        let values = buf.get(rep + def..).map(|_| buf.slice(rep + def..))?;
        let defs = (self.max_def > 0).then(|| buf.slice(rep..rep + def));
        self.data_page(defs, values, levels)
    }

    /// A data page of `levels` rows, its definition levels `defs` and its keys (`values`:
    /// their bit width, one byte, then hybrid data; nothing when no row has a value).
    fn data_page(&self, defs: Option<Bytes>, values: Bytes, levels: u32) -> Option<DataPage> {
        let def_width = (16 - self.max_def.leading_zeros()) as u8;
        let defs = match defs {
            Some(d) => Some(Hybrid::new(d, def_width).ok()?),
            None => None,
        };
        let keys = match values.first() {
            Some(&width) => Hybrid::new(values.slice(1..), width).ok()?,
            None => Hybrid::new(values, 0).ok()?,
        };
        Some(DataPage {
            defs,
            keys,
            left: levels as usize,
        })
    }

    /// Hands the rest of the chunk, from `page` on, to the crate's reader (with the
    /// dictionary page, if one was seen).
    fn hand_on(&mut self, page: Page) {
        let Some(inner) = self.pages.take() else {
            return;
        };
        let mut pending: VecDeque<Page> = self.dict_page.take().into_iter().collect();
        pending.push_back(page);
        let replay = Box::new(Replay { pending, inner });
        let shape = Shape::Value {
            max_def: self.max_def,
        };
        self.handed = Some((self.hand)(self.descr.clone(), replay, shape, self.sep));
    }

    /// Reads the next `n` rows of the current page, their entries appended to `rows`.
    fn read_page(&mut self, n: usize) -> ParquetResult<()> {
        let null = self.null();
        let Some(page) = self.page.as_mut() else {
            return Ok(());
        };
        self.keys.clear();
        match &mut page.defs {
            None => page.keys.read(&mut self.keys, n).map_err(broken)?,
            Some(defs) => {
                self.levels.clear();
                defs.read(&mut self.levels, n).map_err(broken)?;
                let max = self.max_def as u32;
                let present = self.levels.iter().filter(|&&d| d == max).count();
                page.keys.read(&mut self.keys, present).map_err(broken)?;
            }
        }
        page.left -= n;
        let top = self.keys.iter().fold(0, |m, &k| m.max(k));
        if !self.keys.is_empty() && top >= null {
            return Err(ParquetError::General(format!(
                "a page does not decode (dictionary key {top} of {null} entries)"
            )));
        }
        match page.defs {
            None => self.rows.extend_from_slice(&self.keys),
            Some(_) => {
                let max = self.max_def as u32;
                let mut keys = self.keys.iter();
                self.rows
                    .extend(self.levels.iter().map(|&d| match d == max {
                        true => keys.next().copied().unwrap_or(null),
                        false => null,
                    }));
            }
        }
        Ok(())
    }

    /// Skips the next `n` rows of the current page.
    fn skip_page(&mut self, n: usize) -> ParquetResult<()> {
        let Some(page) = self.page.as_mut() else {
            return Ok(());
        };
        let present = match &mut page.defs {
            None => n,
            Some(defs) => {
                self.levels.clear();
                defs.read(&mut self.levels, n).map_err(broken)?;
                let max = self.max_def as u32;
                self.levels.iter().filter(|&&d| d == max).count()
            }
        };
        page.keys.skip(present).map_err(broken)?;
        page.left -= n;
        Ok(())
    }
}

impl<E: Entries> ColumnCells for DictColumn<E> {
    fn skip(&mut self, rows: usize) -> ParquetResult<usize> {
        let mut done = 0;
        while done < rows {
            if let Some(handed) = &mut self.handed {
                return Ok(done + handed.skip(rows - done)?);
            }
            if self.page_done() {
                // A whole page among the rows skipped is skipped unread (where the page
                // reader knows its rows: by the offset index or its header).
                if let Some(pages) = self.pages.as_mut() {
                    match pages.peek_next_page()? {
                        None => break,
                        Some(m) if !m.is_dict => {
                            // A flat column: a row per level.
                            if let Some(r) = m.num_rows.or(m.num_levels) {
                                if r <= rows - done {
                                    pages.skip_next_page()?;
                                    done += r;
                                    continue;
                                }
                            }
                        }
                        Some(_) => {}
                    }
                }
                match self.next_page()? {
                    Next::End => break,
                    Next::Data | Next::Handed => continue,
                }
            }
            let left = self.page.as_ref().map_or(0, |p| p.left);
            let n = (rows - done).min(left);
            self.skip_page(n)?;
            done += n;
        }
        Ok(done)
    }

    fn read(&mut self, rows: usize) -> ParquetResult<usize> {
        self.rows.clear();
        if let Some(handed) = &mut self.handed {
            return handed.read(rows);
        }
        while self.rows.len() < rows {
            if self.page_done() {
                match self.next_page()? {
                    Next::Data => continue,
                    Next::End => break,
                    Next::Handed => {
                        let mine = self.rows.len();
                        let handed = self.handed.as_mut().map_or(Ok(0), |h| h.read(rows - mine));
                        return Ok(mine + handed?);
                    }
                }
            }
            let left = self.page.as_ref().map_or(0, |p| p.left);
            self.read_page((rows - self.rows.len()).min(left))?;
        }
        Ok(self.rows.len())
    }

    fn cells(&self) -> Vec<Cell<'_>> {
        let mut cells: Vec<Cell<'_>> = match &self.entries {
            Some(entries) => self.rows.iter().map(|&k| entries.cell(k)).collect(),
            None => Vec::new(),
        };
        if let Some(handed) = &self.handed {
            cells.extend(handed.cells());
        }
        cells
    }
}

/// A null row's entry (and an empty string's: both missing).
const NULL_ENTRY: Entry = Entry {
    at: 0,
    len: 0,
    hash: 0,
};

/// Whether a data page's values are dictionary keys.
fn is_dictionary(e: Encoding) -> bool {
    matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY)
}

/// Hybrid data that does not decode, as the crate's reader says a page does not.
fn broken(e: HybridError) -> ParquetError {
    ParquetError::General(format!("a page does not decode ({e})"))
}

/// The `n` entries of a plain byte-array dictionary page (each a `u32` length and its
/// bytes), `None` when it does not hold them (or is past 4 GiB).
fn entries_of(buf: &[u8], n: u32) -> Option<Vec<Entry>> {
    u32::try_from(buf.len()).ok()?;
    let mut entries = Vec::with_capacity((n as usize).min(buf.len() / 4) + 1);
    let mut at = 0usize;
    for _ in 0..n {
        let len = u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        buf.get(at..at + len as usize)?;
        entries.push(Entry {
            at: at as u32,
            len,
            hash: 0,
        });
        at += len as usize;
    }
    Some(entries)
}

/// Pages already taken from a chunk's reader (the dictionary page, the page that is not
/// read here), then the rest of it: what the crate's reader reads from there on.
struct Replay {
    pending: VecDeque<Page>,
    inner: Box<dyn PageReader>,
}

impl Iterator for Replay {
    type Item = ParquetResult<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for Replay {
    fn get_next_page(&mut self) -> ParquetResult<Option<Page>> {
        match self.pending.pop_front() {
            Some(page) => Ok(Some(page)),
            None => self.inner.get_next_page(),
        }
    }

    fn peek_next_page(&mut self) -> ParquetResult<Option<PageMetadata>> {
        let Some(page) = self.pending.front() else {
            return self.inner.peek_next_page();
        };
        Ok(Some(match page {
            Page::DictionaryPage { .. } => PageMetadata {
                num_rows: None,
                num_levels: None,
                is_dict: true,
            },
            Page::DataPage { num_values, .. } => PageMetadata {
                num_rows: None,
                num_levels: Some(*num_values as usize),
                is_dict: false,
            },
            Page::DataPageV2 {
                num_values,
                num_rows,
                ..
            } => PageMetadata {
                num_rows: Some(*num_rows as usize),
                num_levels: Some(*num_values as usize),
                is_dict: false,
            },
        }))
    }

    fn skip_next_page(&mut self) -> ParquetResult<()> {
        match self.pending.pop_front() {
            Some(_) => Ok(()),
            None => self.inner.skip_next_page(),
        }
    }

    fn at_record_boundary(&mut self) -> ParquetResult<bool> {
        match self.pending.is_empty() {
            true => self.inner.at_record_boundary(),
            // A flat column: every page starts a row.
            false => Ok(true),
        }
    }
}

#[cfg(test)]
mod tests;

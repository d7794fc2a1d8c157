//! Byte-array values hashed once per dictionary entry, not once per row.
//!
//! Parquet's column reader hands out a dictionary-encoded page's values as slices of the
//! dictionary page (the entry each row's key points to), not the keys. [`DictPages`] passes the
//! pages through and keeps the dictionary page it saw; [`DictHashes`] knows a value by where it
//! sits in that page (its offset and length: the entry) and computes each entry's
//! [`value_hash`] the first time a row holds it. A value outside the dictionary page (a plain
//! page's) is not hashed here. Holding the page keeps its bytes alive and unchanged (they are
//! `Bytes`), so a live value that lies inside them is that entry: the hash is the hash of the
//! value's own bytes, whatever the reader does.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::errors::Result as ParquetResult;

use crate::ids::value_hash;

/// The dictionary page of a column chunk as [`DictPages`] saw it pass, with its entry count.
type Seen = Arc<Mutex<Option<(Bytes, u32)>>>;

/// A column chunk's pages, passed through, the dictionary page kept for [`DictHashes`].
pub(crate) struct DictPages {
    inner: Box<dyn PageReader>,
    seen: Seen,
}

impl DictPages {
    /// `inner`'s pages, and what hashes their dictionary entries.
    pub fn new(inner: Box<dyn PageReader>) -> (DictPages, DictHashes) {
        let seen = Seen::default();
        let hashes = DictHashes {
            seen: Arc::clone(&seen),
            dict: None,
            slots: Vec::new(),
            shift: 0,
        };
        (DictPages { inner, seen }, hashes)
    }
}

impl Iterator for DictPages {
    type Item = ParquetResult<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for DictPages {
    fn get_next_page(&mut self) -> ParquetResult<Option<Page>> {
        let page = self.inner.get_next_page()?;
        if let Some(Page::DictionaryPage {
            buf, num_values, ..
        }) = &page
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            *seen = Some((buf.clone(), *num_values));
        }
        Ok(page)
    }

    fn peek_next_page(&mut self) -> ParquetResult<Option<PageMetadata>> {
        self.inner.peek_next_page()
    }

    fn skip_next_page(&mut self) -> ParquetResult<()> {
        self.inner.skip_next_page()
    }

    fn at_record_boundary(&mut self) -> ParquetResult<bool> {
        self.inner.at_record_boundary()
    }
}

/// No entry in a slot (an offset of a page is below 2^31).
const EMPTY: u64 = u64::MAX;

/// Most slots of the cache (a larger dictionary shares them).
const MAX_SLOTS_LOG2: u32 = 16;

/// The hashes of the entries of the dictionary page [`DictPages`] saw: a direct-mapped cache
/// by the entry's place in the page.
pub(crate) struct DictHashes {
    seen: Seen,
    dict: Option<Bytes>,
    /// `(offset << 32 | len, hash)` of an entry, at a slot its offset picks.
    slots: Vec<(u64, u64)>,
    /// `64 - log2(slots)`.
    shift: u32,
}

impl DictHashes {
    /// Takes up the dictionary page seen since the last call (after a read of values).
    pub fn refresh(&mut self) {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((page, entries)) = seen {
            // Two slots per entry, as a power of two: few entries share one.
            let bits = (2 * entries.max(1)).next_power_of_two().trailing_zeros();
            let bits = bits.clamp(4, MAX_SLOTS_LOG2);
            self.dict = Some(page);
            self.slots = vec![(EMPTY, 0); 1 << bits];
            self.shift = 64 - bits;
        }
    }

    /// The [`value_hash`] of `v` when it is an entry of the dictionary page, else `None`.
    #[inline]
    pub fn hash(&mut self, v: &[u8]) -> Option<u64> {
        let page = self.dict.as_ref()?;
        let (base, at) = (page.as_ptr() as usize, v.as_ptr() as usize);
        let offset = at.checked_sub(base)?;
        if v.is_empty() || offset + v.len() > page.len() {
            return None;
        }
        let key = ((offset as u64) << 32) | v.len() as u64;
        let slot = ((offset as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize;
        let (k, h) = &mut self.slots[slot];
        if *k != key {
            (*k, *h) = (key, value_hash(v));
        }
        Some(*h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dictionary page of `entries` as Parquet writes one (plain: u32 length, bytes).
    fn plain(entries: &[&[u8]]) -> Bytes {
        let mut buf = Vec::new();
        for e in entries {
            buf.extend_from_slice(&(e.len() as u32).to_le_bytes());
            buf.extend_from_slice(e);
        }
        Bytes::from(buf)
    }

    fn hashes_of(page: &Bytes, entries: u32) -> DictHashes {
        let seen = Seen::default();
        *seen.lock().unwrap() = Some((page.clone(), entries));
        let mut h = DictHashes {
            seen,
            dict: None,
            slots: Vec::new(),
            shift: 0,
        };
        h.refresh();
        h
    }

    #[test]
    fn entries_of_the_page_are_hashed_as_their_bytes_and_others_are_not() {
        let words: Vec<Vec<u8>> = (0..100).map(|i| format!("w{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
        let page = plain(&refs);
        let mut h = hashes_of(&page, 4);
        let mut at = 0;
        let mut slices = Vec::new();
        for w in &words {
            slices.push(page.slice(at + 4..at + 4 + w.len()));
            at += 4 + w.len();
        }
        // Twice each, in an order that makes entries share slots (4 entries' worth of them).
        for round in 0..2 {
            for (s, w) in slices.iter().zip(&words).rev() {
                assert_eq!(h.hash(s), Some(value_hash(w)), "round {round}");
            }
        }
        // A prefix of an entry is another key, hashed as its own bytes.
        assert_eq!(h.hash(&slices[10][..1]), Some(value_hash(b"w")));
        let elsewhere = Bytes::from(b"w1".to_vec());
        assert_eq!(h.hash(&elsewhere), None);
        assert_eq!(h.hash(&page[..0]), None);
    }

    #[test]
    fn nothing_is_hashed_before_a_dictionary_page() {
        let mut h = hashes_of(&Bytes::new(), 0);
        h.dict = None;
        assert_eq!(h.hash(b"x"), None);
    }
}

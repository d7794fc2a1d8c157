//! Parquet's RLE / bit-packed hybrid encoding, decoded: the keys of a dictionary-encoded data
//! page and the definition levels of a page (the parquet crate keeps its own decoder private).
//!
//! The data is a sequence of runs, each a ULEB128 header `h`: `h & 1 == 0` is a repeated run
//! of `h >> 1` copies of one value (in `ceil(width / 8)` little-endian bytes), `h & 1 == 1`
//! a bit-packed run of `(h >> 1) * 8` values of `width` bits each, least significant bit
//! first (the last group of a page may be padded, or cut short by a writer: only the values
//! asked for must be there).

use bytes::Bytes;
use thiserror::Error;

/// Why hybrid data does not decode.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum HybridError {
    #[error("a bit width of {0} (at most 32)")]
    Width(u8),
    #[error("the data ends {0} values short")]
    Short(usize),
}

/// The run being read.
#[derive(Clone, Copy, Debug)]
enum Run {
    /// `left` more copies of `value`.
    Repeat { value: u32, left: usize },
    /// Values `next..end` of the bit-packed run whose bytes start at `at`.
    Packed { at: usize, next: usize, end: usize },
}

/// A reader of hybrid data of one bit width.
pub(crate) struct Hybrid {
    data: Bytes,
    /// Where the next run header is.
    pos: usize,
    width: u32,
    mask: u64,
    run: Run,
}

impl Hybrid {
    /// A reader of `data`, values of `width` bits.
    pub fn new(data: Bytes, width: u8) -> Result<Hybrid, HybridError> {
        if width > 32 {
            return Err(HybridError::Width(width));
        }
        Ok(Hybrid {
            data,
            pos: 0,
            width: u32::from(width),
            mask: (1u64 << width) - 1,
            run: Run::Repeat { value: 0, left: 0 },
        })
    }

    /// Appends the next `n` values to `out`.
    pub fn read(&mut self, out: &mut Vec<u32>, n: usize) -> Result<(), HybridError> {
        out.reserve(n);
        let mut left = n;
        while left > 0 {
            let take = match self.run {
                Run::Repeat { value, left: have } => {
                    let take = have.min(left);
                    out.extend(std::iter::repeat_n(value, take));
                    self.run = Run::Repeat {
                        value,
                        left: have - take,
                    };
                    take
                }
                Run::Packed { at, next, end } => {
                    let take = (end - next).min(left);
                    let bytes = &self.data[at..];
                    out.extend(
                        (next..next + take).map(|i| unpack(bytes, i, self.width, self.mask)),
                    );
                    self.run = Run::Packed {
                        at,
                        next: next + take,
                        end,
                    };
                    take
                }
            };
            left -= take;
            if take == 0 && !self.next_run() {
                return Err(HybridError::Short(left));
            }
        }
        Ok(())
    }

    /// Skips the next `n` values.
    pub fn skip(&mut self, n: usize) -> Result<(), HybridError> {
        let mut left = n;
        while left > 0 {
            let take = match &mut self.run {
                Run::Repeat { left: have, .. } => {
                    let take = (*have).min(left);
                    *have -= take;
                    take
                }
                Run::Packed { next, end, .. } => {
                    let take = (*end - *next).min(left);
                    *next += take;
                    take
                }
            };
            left -= take;
            if take == 0 && !self.next_run() {
                return Err(HybridError::Short(left));
            }
        }
        Ok(())
    }

    /// Starts the next run; `false` at the end of the data (or a header that does not read,
    /// which ends it too).
    fn next_run(&mut self) -> bool {
        let Some((header, len)) = uleb128(&self.data[self.pos..]) else {
            return false;
        };
        self.pos += len;
        let count = (header >> 1) as usize;
        if header & 1 == 0 {
            let bytes = self.width.div_ceil(8) as usize;
            let Some(raw) = self.data.get(self.pos..self.pos + bytes) else {
                return false;
            };
            let mut word = [0u8; 4];
            word[..bytes].copy_from_slice(raw);
            self.pos += bytes;
            self.run = Run::Repeat {
                value: u32::from_le_bytes(word),
                left: count,
            };
        } else {
            let at = self.pos;
            let bytes = count * self.width as usize;
            let have = bytes.min(self.data.len() - at);
            // A run cut short by the end of the data holds the values its bytes hold.
            let values = match self.width {
                0 => count * 8,
                w => (have * 8 / w as usize).min(count * 8),
            };
            self.pos = at + have;
            self.run = Run::Packed {
                at,
                next: 0,
                end: values,
            };
        }
        true
    }
}

/// Value `i` of `width` bits packed from the start of `bytes` (`mask`: `width` ones).
#[inline(always)]
fn unpack(bytes: &[u8], i: usize, width: u32, mask: u64) -> u32 {
    let bit = i * width as usize;
    let at = bit / 8;
    let word = match bytes.get(at..at + 8) {
        Some(b) => u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
        None => {
            let mut w = [0u8; 8];
            let tail = bytes.get(at..).unwrap_or(&[]);
            w[..tail.len()].copy_from_slice(tail);
            u64::from_le_bytes(w)
        }
    };
    ((word >> (bit % 8)) & mask) as u32
}

/// The ULEB128 number at the start of `data` (at most 32 bits) and its length.
fn uleb128(data: &[u8]) -> Option<(u32, usize)> {
    let mut value = 0u64;
    for (k, &b) in data.iter().enumerate().take(5) {
        value |= u64::from(b & 0x7f) << (7 * k);
        if b & 0x80 == 0 {
            return u32::try_from(value).ok().map(|v| (v, k + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs of `(value, count, packed)` encoded by the format's definition (a packed run of
    /// `count` values padded with zeros to a multiple of 8).
    fn encode(width: u8, runs: &[(u32, usize, bool)], values: &mut Vec<u32>) -> Vec<u8> {
        let mut out = Vec::new();
        let header = |out: &mut Vec<u8>, mut h: u32| loop {
            let b = (h & 0x7f) as u8;
            h >>= 7;
            if h == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        };
        let mask = if width == 32 {
            u32::MAX
        } else {
            (1u32 << width) - 1
        };
        for (k, &(value, count, packed)) in runs.iter().enumerate() {
            let value = value & mask;
            if packed {
                let groups = count.div_ceil(8);
                header(&mut out, (groups as u32) << 1 | 1);
                // Distinct values in a packed run: value, value + 1, ... (masked); whole
                // groups of 8, of which the last run's padding is not asked for.
                let last = k + 1 == runs.len();
                let run: Vec<u32> = (0..groups * 8)
                    .map(|i| value.wrapping_add(i as u32 * (k as u32 + 1)) & mask)
                    .collect();
                let mut bits = vec![0u8; groups * width as usize];
                for (i, v) in run.iter().enumerate() {
                    for b in 0..width as usize {
                        if v >> b & 1 == 1 {
                            let at = i * width as usize + b;
                            bits[at / 8] |= 1 << (at % 8);
                        }
                    }
                }
                out.extend_from_slice(&bits);
                values.extend(&run[..if last { count } else { run.len() }]);
            } else {
                header(&mut out, (count as u32) << 1);
                out.extend_from_slice(&value.to_le_bytes()[..(width as usize).div_ceil(8)]);
                values.extend(std::iter::repeat_n(value, count));
            }
        }
        out
    }

    #[test]
    fn the_formats_example_decodes() {
        // The spec's bit-packing example: 0..7 with width 3 is `10001000 11000110 11111010`.
        let data = Bytes::from(vec![0b11, 0b1000_1000, 0b1100_0110, 0b1111_1010]);
        let mut h = Hybrid::new(data, 3).unwrap();
        let mut out = Vec::new();
        h.read(&mut out, 8).unwrap();
        assert_eq!(out, (0..8).collect::<Vec<u32>>());
        assert_eq!(h.read(&mut out, 1), Err(HybridError::Short(1)));
        // A repeated run of 300 fives, width 4: header 600 as ULEB128.
        let data = Bytes::from(vec![0xD8, 0x04, 5]);
        let mut h = Hybrid::new(data, 4).unwrap();
        let mut out = Vec::new();
        h.skip(100).unwrap();
        h.read(&mut out, 200).unwrap();
        assert_eq!(out, vec![5; 200]);
        assert!(Hybrid::new(Bytes::new(), 33).is_err());
    }

    #[test]
    fn a_packed_run_cut_short_holds_the_values_of_its_bytes() {
        // Two groups announced (16 values of width 8), 10 bytes there.
        let mut data = vec![0b101];
        data.extend(1..=10u8);
        let mut h = Hybrid::new(Bytes::from(data), 8).unwrap();
        let mut out = Vec::new();
        h.read(&mut out, 10).unwrap();
        assert_eq!(out, (1..=10).collect::<Vec<u32>>());
        assert_eq!(h.read(&mut out, 1), Err(HybridError::Short(1)));
    }

    proptest! {
        #[test]
        fn runs_decode_to_their_values_read_and_skipped_in_any_pieces(
            width in 0u8..=32,
            runs in prop::collection::vec((any::<u32>(), 1usize..70, any::<bool>()), 0..12),
            pieces in prop::collection::vec((1usize..90, any::<bool>()), 1..20),
        ) {
            let mut want = Vec::new();
            let data = encode(width, &runs, &mut want);
            let mut h = Hybrid::new(Bytes::from(data), width).unwrap();
            let (mut at, mut got) = (0, Vec::new());
            for (n, skip) in pieces {
                let n = n.min(want.len() - at);
                if skip {
                    h.skip(n).unwrap();
                } else {
                    got.clear();
                    h.read(&mut got, n).unwrap();
                    prop_assert_eq!(&got[..], &want[at..at + n]);
                }
                at += n;
            }
        }
    }
}

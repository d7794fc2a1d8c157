//! TFRecord framing, as TensorFlow's `RecordWriter` writes it: the data's length as a u64
//! (little endian), the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the
//! data (both u32 little endian).

use std::io::Write;

/// Added to the rotated CRC by [`masked_crc`] (TensorFlow's `kMaskDelta`).
const MASK_DELTA: u32 = 0xa282_ead8;

/// TensorFlow's masked CRC-32C of `data`: the CRC rotated right by 15 bits plus
/// `0xa282ead8` (a CRC stored next to the bytes it covers, masked so that a CRC of CRCs is
/// not trivially another valid one).
pub fn masked_crc(data: &[u8]) -> u32 {
    mask(crc32c::crc32c(data))
}

/// Masks a CRC: `((crc >> 15) | (crc << 17)) + 0xa282ead8`, wrapping.
pub fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Writes `data` as one record.
pub fn write_record(out: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc(&len).to_le_bytes())?;
    out.write_all(data)?;
    out.write_all(&masked_crc(data).to_le_bytes())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::read::{records, Bad};

    #[test]
    fn crc32c_of_the_check_string_is_the_known_value() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn masked_crc_rotates_right_by_15_and_adds_the_delta() {
        // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, mod 2^32.
        assert_eq!(masked_crc(b"123456789"), 0xC78A_B0E5);
        assert_eq!(mask(0), MASK_DELTA);
        // A wrapping add: the rotated value 0xffffffff plus the delta.
        assert_eq!(mask(u32::MAX), MASK_DELTA.wrapping_sub(1));
    }

    #[test]
    fn a_record_is_length_crc_data_crc() {
        let mut out = Vec::new();
        write_record(&mut out, b"abc").unwrap();
        assert_eq!(out.len(), 8 + 4 + 3 + 4);
        assert_eq!(&out[..8], &3u64.to_le_bytes());
        assert_eq!(&out[8..12], &masked_crc(&3u64.to_le_bytes()).to_le_bytes());
        assert_eq!(&out[12..15], b"abc");
        assert_eq!(&out[15..], &masked_crc(b"abc").to_le_bytes());
    }

    #[test]
    fn the_reader_refuses_a_flipped_data_byte_and_a_cut_record() {
        let mut out = Vec::new();
        write_record(&mut out, b"hello").unwrap();
        let mut bad = out.clone();
        bad[13] ^= 1;
        assert_eq!(records(&bad), Err(Bad::DataCrc { at: 0 }));
        let mut bad = out.clone();
        bad[0] ^= 1;
        assert_eq!(records(&bad), Err(Bad::LengthCrc { at: 0 }));
        assert_eq!(
            records(&out[..out.len() - 1]),
            Err(Bad::Truncated { at: 0 })
        );
    }

    proptest! {
        #[test]
        fn any_records_read_back_in_order(
            data in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20)
        ) {
            let mut out = Vec::new();
            for d in &data {
                write_record(&mut out, d).unwrap();
            }
            prop_assert_eq!(records(&out).unwrap(), data);
        }
    }
}

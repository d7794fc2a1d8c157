//! Kafka fetch answers: the record bytes of one partition's answer read exactly as a fetch
//! task reads them, from an offset and to an end taken from the input's first bytes. The
//! bytes are the input's rest as they are (any frames, cut-short tails) or, when the first
//! byte is odd, an answer built from it (valid batches of every codec, transactional or
//! not, commit and abort markers, then some bytes flipped: CRCs, lengths, deltas). Reading
//! never panics; what it releases is in strictly increasing offset order inside
//! [from, end), the position never goes back nor passes the next fetch offset, and a batch
//! cut short at the end is bigger than the bytes left of it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    // Offsets kept small and non-negative, as a partition's are.
    let from = i64::from(u32::from_le_bytes([data[0], data[1], data[2], 0]));
    let end = match data[3] {
        0..=127 => None,
        _ => Some(from + i64::from(u32::from_le_bytes([data[4], data[5], 0, 0]))),
    };
    let built;
    let records = if data[0] % 2 == 1 {
        built = sparta_data::kafka::fuzz_build_answer(&data[6..]);
        &built[..]
    } else {
        &data[6..]
    };
    let Ok(a) = sparta_data::kafka::fuzz_read_answer(records, from, end) else {
        return;
    };
    let mut last = from - 1;
    for &o in &a.released {
        assert!(o > last, "released offset {o} after {last}");
        assert!(end.is_none_or(|e| o < e), "released offset {o} at or past the end {end:?}");
        last = o;
    }
    assert!(a.position >= from, "position {} before the start {from}", a.position);
    assert!(a.position > last, "position {} not past the released {last}", a.position);
    assert!(a.next_fetch >= from, "next fetch {} before the start {from}", a.next_fetch);
    assert!(
        a.position <= a.next_fetch,
        "position {} past the next fetch {}",
        a.position,
        a.next_fetch
    );
    if let Some(size) = a.cut_short {
        assert!(size >= 12, "a cut-short batch of {size} bytes");
    }
});

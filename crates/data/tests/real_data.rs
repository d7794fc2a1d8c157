//! Parsing of the real Criteo and Avazu samples, plain and gzip, 1 and 4 threads.

mod common;

use common::*;
use sparta_data::{feature_id, missing_id, read_all, Schema};

#[test]
#[ignore = "an extra case on the real samples in ../shared/data: cargo test -p sparta-data --test real_data -- --ignored"]
fn criteo_sample_one_and_four_threads() {
    let Some(path) = shared_sample("criteo/criteo_kaggle_sample.tsv") else {
        panic!("the real sample is absent: this case needs ../shared/data");
    };
    let paths = [path];
    let (one, st1) = read_all(&paths, &config(Schema::criteo(), 1000, 1)).unwrap();
    assert_eq!(st1.rows, 14_950);
    assert_eq!(st1.bad_lines, 0);
    assert_eq!(st1.files, 1);
    assert_eq!(one.iter().map(|b| b.positives()).sum::<usize>(), 3_423);
    // one thread: full batches except the last
    assert!(one[..one.len() - 1].iter().all(|b| b.rows == 1000));
    assert_eq!(one.last().unwrap().rows, 950);
    assert!(one
        .iter()
        .all(|b| b.is_single_valued() && b.num_fields == 26 && b.num_dense == 13));
    // first row: "0	1	1	5	0	1382	4	15	2	181	1	2		2	68fd1e64	80e26c9b ..."
    let b = &one[0];
    assert_eq!(b.labels[0], 0.0);
    assert_eq!(b.dense[0], 2f32.ln());
    assert_eq!(b.dense[4], 1383f32.ln());
    assert_eq!(b.dense[11], 0.0); // I12 missing
    assert_eq!(b.ids[0], feature_id(0, b"68fd1e64"));
    assert_eq!(b.ids[1], feature_id(1, b"80e26c9b"));
    assert_eq!(b.ids[21], missing_id(21)); // C22 missing
    assert_eq!(b.ids[25], feature_id(25, b"9727dd16"));

    let (four, st4) = read_all(&paths, &config(Schema::criteo(), 1000, 4)).unwrap();
    assert_eq!(st4.rows, 14_950);
    assert_eq!(sorted(rows(&four)), sorted(rows(&one)));
    // deterministic with one thread
    let (again, _) = read_all(&paths, &config(Schema::criteo(), 1000, 1)).unwrap();
    assert_eq!(again, one);
}

#[test]
#[ignore = "an extra case on the real samples in ../shared/data: cargo test -p sparta-data --test real_data -- --ignored"]
fn criteo_sample_gzip_equals_plain() {
    let Some(path) = shared_sample("criteo/criteo_kaggle_sample.tsv") else {
        panic!("the real sample is absent: this case needs ../shared/data");
    };
    let dir = tempfile::tempdir().unwrap();
    // no .gz extension: detection is by magic bytes
    let gz = write_file(
        dir.path(),
        "sample.data",
        &gzip(&std::fs::read(&path).unwrap()),
    );
    let cfg = config(Schema::criteo(), 512, 1);
    let (plain, _) = read_all(&[path], &cfg).unwrap();
    let (zipped, st) = read_all(std::slice::from_ref(&gz), &cfg).unwrap();
    assert_eq!(zipped, plain);
    assert_eq!(st.rows, 14_950);
    let (zipped4, _) = read_all(&[gz], &config(Schema::criteo(), 512, 4)).unwrap();
    assert_eq!(sorted(rows(&zipped4)), sorted(rows(&plain)));
}

#[test]
#[ignore = "an extra case on the real samples in ../shared/data: cargo test -p sparta-data --test real_data -- --ignored"]
fn avazu_sample() {
    let Some(path) = shared_sample("avazu/avazu_sample.csv") else {
        panic!("the real sample is absent: this case needs ../shared/data");
    };
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    let clicks = lines
        .iter()
        .filter(|l| l.split(',').nth(1) == Some("1"))
        .count();
    let (batches, st) = read_all(&[path], &config(Schema::avazu(), 4096, 2)).unwrap();
    assert_eq!(st.bad_lines, 0);
    assert_eq!(st.rows as usize, lines.len());
    assert_eq!(batches.iter().map(|b| b.positives()).sum::<usize>(), clicks);
    assert!(batches
        .iter()
        .all(|b| b.num_fields == 22 && b.num_dense == 0 && b.is_single_valued()));
    // the first data line's hour is field 0
    let hour = lines[0].split(',').nth(2).unwrap();
    let all = rows(&batches);
    assert!(all.iter().any(|r| r.2[0] == feature_id(0, hour.as_bytes())));
}

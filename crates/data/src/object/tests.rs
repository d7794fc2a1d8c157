//! The object client on `object_store`'s in-memory store and local file system: expansion
//! (exact object, prefix, glob, name order), ranged reads with read-ahead equal to the bytes,
//! an object replaced while read.

use std::path::Path;
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, PutPayload};

use super::*;
use crate::input::{read_full_at, RangeRead};

fn client_with(objects: &[(&str, Vec<u8>)], prefetch: Prefetch) -> Arc<ObjectClient> {
    let store = Arc::new(InMemory::new());
    let opts = ObjectOptions {
        prefetch,
        ..Default::default()
    };
    let client = ObjectClient::with_store(opts, "bkt", store.clone()).unwrap();
    for (key, data) in objects {
        let (s, k, d) = (store.clone(), ObjPath::from(*key), data.clone());
        client
            .block_on(async move { s.put(&k, PutPayload::from(d)).await })
            .unwrap()
            .unwrap();
    }
    client
}

fn names(entries: &[ObjectEntry]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e.url.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn expand_exact_prefix_and_glob_in_name_order() {
    let c = client_with(
        &[
            ("logs/b.tsv", b"b".to_vec()),
            ("logs/a.tsv", b"a".to_vec()),
            ("logs/sub/c.gz", b"c".to_vec()),
            ("logs/.hidden", b"h".to_vec()),
            ("logs/d.tsv.tmp", b"t".to_vec()),
            ("other/x.tsv", b"x".to_vec()),
        ],
        Prefetch::default(),
    );
    let all = c.expand(Path::new("s3://bkt/logs/")).unwrap();
    assert_eq!(
        names(&all),
        [
            "s3://bkt/logs/a.tsv",
            "s3://bkt/logs/b.tsv",
            "s3://bkt/logs/sub/c.gz"
        ]
    );
    assert_eq!(all[0].size, 1);
    // A prefix without the slash, when no object has that exact name.
    assert_eq!(c.expand(Path::new("s3://bkt/logs")).unwrap().len(), 3);
    let one = c.expand(Path::new("s3://bkt/logs/b.tsv")).unwrap();
    assert_eq!(names(&one), ["s3://bkt/logs/b.tsv"]);
    // `*` does not cross `/`.
    let glob = c.expand(Path::new("s3://bkt/logs/*.tsv")).unwrap();
    assert_eq!(names(&glob), ["s3://bkt/logs/a.tsv", "s3://bkt/logs/b.tsv"]);
    let deep = c.expand(Path::new("s3://bkt/logs/*/*.gz")).unwrap();
    assert_eq!(names(&deep), ["s3://bkt/logs/sub/c.gz"]);
    let missing = c.expand(Path::new("s3://bkt/nothing/")).unwrap_err();
    assert!(matches!(missing, DataError::NotFound { .. }), "{missing}");
    let listed = c.list_dir(Path::new("s3://bkt/logs/")).unwrap();
    let listed: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(listed, [".hidden", "a.tsv", "b.tsv", "d.tsv.tmp"]);
}

#[test]
fn ranged_reads_with_read_ahead_return_the_bytes() {
    let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 % 251) as u8).collect();
    for prefetch in [
        Prefetch {
            block: 4096,
            ahead: 0,
        },
        Prefetch {
            block: 65_536,
            ahead: 3,
        },
        Prefetch {
            block: 1 << 20,
            ahead: 2,
        },
    ] {
        let c = client_with(&[("d/x.bin", data.clone())], prefetch);
        let stats = Arc::new(crate::stats::ReadStats::default());
        let obj = c.open(Path::new("s3://bkt/d/x.bin")).unwrap();
        obj.count_in(Arc::clone(&stats));
        assert_eq!(obj.len(), data.len() as u64);
        // Sequential reads of odd sizes.
        let mut got = Vec::new();
        let mut buf = vec![0u8; 70_001];
        let mut at = 0u64;
        loop {
            let n = read_full_at(&obj, &mut buf, at).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            at += n as u64;
        }
        assert_eq!(got, data, "{prefetch:?}");
        // Small isolated reads anywhere, and past the end.
        for off in [0u64, 5, 4095, 4096, 65_535, 999_999, 1_000_002] {
            let mut b = [0u8; 3];
            let n = obj.read_at(&mut b, off).unwrap();
            let want = &data[off as usize..(off as usize + 3).min(data.len())];
            assert_eq!(&b[..n], &want[..n], "at {off}");
            assert!(n >= 1);
        }
        assert_eq!(obj.read_at(&mut [0u8; 4], data.len() as u64).unwrap(), 0);
        assert!(stats.source_bytes() >= data.len() as u64);
    }
}

#[test]
fn an_object_replaced_while_read_is_refused() {
    let c = client_with(
        &[("d/x", vec![1u8; 200_000])],
        Prefetch {
            block: 65_536,
            ahead: 0,
        },
    );
    let obj = c.open(Path::new("s3://bkt/d/x")).unwrap();
    let mut buf = vec![0u8; 65_536];
    assert_eq!(obj.read_at(&mut buf, 0).unwrap(), 65_536);
    let store = Arc::clone(
        &c.stores.lock()[&StoreId::S3 {
            bucket: "bkt".into(),
        }],
    );
    c.block_on(async move {
        store
            .put(&ObjPath::from("d/x"), PutPayload::from(vec![2u8; 200_000]))
            .await
    })
    .unwrap()
    .unwrap();
    let err = read_full_at(&obj, &mut buf, 131_072).unwrap_err();
    assert!(err.to_string().contains("replaced while read"), "{err}");
}

#[test]
fn not_found_and_bad_urls_are_named() {
    let c = client_with(&[], Prefetch::default());
    let e = c.open(Path::new("s3://bkt/missing.tsv")).unwrap_err();
    assert!(matches!(e, DataError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("s3://bkt/missing.tsv"), "{e}");
    let e = c.expand(Path::new("gs://bkt/x")).unwrap_err();
    assert!(e.to_string().contains("unsupported scheme"), "{e}");
    let e = c.expand(Path::new("file://relative/x")).unwrap_err();
    assert!(e.to_string().contains("absolute path"), "{e}");
}

#[test]
fn file_urls_read_the_local_file_system() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.tsv"), b"2\n").unwrap();
    std::fs::write(dir.path().join("a.tsv"), b"1\n").unwrap();
    let c = client_with(&[], Prefetch::default());
    let url = format!("file://{}/", dir.path().display());
    let got = c.expand(Path::new(&url)).unwrap();
    assert_eq!(got.len(), 2);
    assert!(got[0].url.to_string_lossy().ends_with("/a.tsv"));
    let obj = c.open(&got[1].url).unwrap();
    let mut b = [0u8; 8];
    assert_eq!(obj.read_at(&mut b, 0).unwrap(), 2);
    assert_eq!(&b[..2], b"2\n");
}

#[test]
fn listed_objects_open_together_with_their_first_bytes() {
    let objects: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("many/{i:03}.tsv"), vec![b'a' + (i % 26) as u8; i]))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = objects
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let c = client_with(&refs, Prefetch::default());
    let entries = c.expand(Path::new("s3://bkt/many/")).unwrap();
    assert_eq!(entries.len(), 40);
    let opened = c.open_listed(&entries, 4).unwrap();
    for (i, (obj, head)) in opened.iter().enumerate() {
        assert_eq!(obj.len(), i as u64, "{}", obj.url().display());
        assert_eq!(&head[..], &objects[i].1[..i.min(4)]);
        assert!(obj
            .url()
            .to_string_lossy()
            .ends_with(&format!("{i:03}.tsv")));
    }
    // An object deleted between the listing and the open is named.
    let store = Arc::clone(
        &c.stores.lock()[&StoreId::S3 {
            bucket: "bkt".into(),
        }],
    );
    c.block_on(async move { store.delete(&ObjPath::from("many/005.tsv")).await })
        .unwrap()
        .unwrap();
    let e = c.open_listed(&entries, 4).unwrap_err();
    assert!(e.to_string().contains("many/005.tsv"), "{e}");
}

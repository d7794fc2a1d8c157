//! The reader's threads run at the nice value asked for (`ReaderConfig::nice`), the calling
//! thread at its own. One test per binary: other tests' readers have threads of the same names.
#![cfg(target_os = "linux")]

use sparta_data::priority::this_thread_nice;
use sparta_data::{read_batches, write_synthetic, ReaderConfig, Schema, SynthConfig};

/// `(name, nice)` of every thread of this process whose name starts with one of `prefixes`.
fn threads_named(prefixes: &[&str]) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = entry.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let comm = comm.trim().to_string();
        if !prefixes.iter().any(|p| comm.starts_with(p)) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // Fields after the parenthesised name: state is field 3, nice is field 19.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let nice: i32 = rest.split(' ').nth(19 - 3).unwrap().parse().unwrap();
        out.push((comm, nice));
    }
    out.sort();
    out
}

#[test]
fn reader_threads_run_at_the_configured_nice_increment_and_the_caller_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = Vec::new();
    write_synthetic(
        &SynthConfig {
            rows: 20_000,
            ..SynthConfig::default()
        },
        &mut text,
    )
    .unwrap();
    let path = dir.path().join("train.tsv");
    std::fs::write(&path, &text).unwrap();
    // The input is a pipe held open until the threads were looked at: the driver thread
    // (which ends once a file is all handed out) is still reading it then.
    let fifo = dir.path().join("train.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path `c` points to, alive for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let (close_tx, close_rx) = std::sync::mpsc::channel::<()>();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            w.write_all(&text).unwrap();
            let _ = close_rx.recv();
        })
    };

    let base = this_thread_nice();
    let cfg = ReaderConfig {
        batch_size: 256,
        threads: 2,
        queue_batches: 1,
        nice: 7,
        ..ReaderConfig::new(Schema::criteo())
    };
    let mut stream = read_batches(std::slice::from_ref(&fifo), &cfg).unwrap();
    // A small queue: with one batch taken, the reader's threads are still running.
    let first = stream.next().unwrap().unwrap();
    assert_eq!(first.rows, 256);
    // Each thread lowers its own priority as it starts, and a thread may not have run yet
    // when the first batch comes (another parser parsed it): wait until all four did, or
    // fail after a minute naming what was seen.
    let want = (base + 7).min(19);
    let names = [
        "sparta-assemble",
        "sparta-feed",
        "sparta-parse-0",
        "sparta-parse-1",
    ];
    let start = std::time::Instant::now();
    loop {
        let seen = threads_named(&["sparta-parse-", "sparta-assemble", "sparta-feed"]);
        let alive: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            alive, names,
            "the reader's threads, alive while its input is open and batches are left"
        );
        if seen.iter().all(|(_, nice)| *nice == want) {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "reader threads not at nice {want}: {seen:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(this_thread_nice(), base, "the caller's own nice value");
    close_tx.send(()).unwrap();
    let rows: usize = first.rows + stream.map(|b| b.unwrap().rows).sum::<usize>();
    assert_eq!(rows, 20_000);
    writer.join().unwrap();

    let refused = ReaderConfig { nice: 20, ..cfg };
    let err = read_batches(&[path], &refused)
        .err()
        .expect("nice 20 refused");
    assert!(err.to_string().contains("nice"), "{err}");
}

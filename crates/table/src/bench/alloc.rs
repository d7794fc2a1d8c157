//! Memory measurement: a counting global allocator (install it in the bench binary with
//! `#[global_allocator]`), falling back to the process RSS delta when it is not installed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Global allocator wrapper (around `System` by default, or any allocator such as mimalloc)
/// that counts live requested bytes.
pub struct CountingAlloc<A = System>(pub A);

// SAFETY: every method forwards to the inner allocator with the caller's arguments unchanged
// and only adds relaxed counter updates, so the inner allocator's guarantees carry over.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Relaxed);
        INSTALLED.store(true, Relaxed);
        // SAFETY: forwarded contract of `GlobalAlloc::alloc`.
        unsafe { self.0.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Relaxed);
        INSTALLED.store(true, Relaxed);
        // SAFETY: forwarded contract of `GlobalAlloc::alloc_zeroed`.
        unsafe { self.0.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Relaxed);
        // SAFETY: forwarded contract of `GlobalAlloc::dealloc`.
        unsafe { self.0.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        // SAFETY: forwarded contract of `GlobalAlloc::realloc`.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

/// A memory reading: counted live heap bytes if `CountingAlloc` is installed, else RSS.
#[derive(Clone, Copy, Debug)]
pub struct MemReading {
    bytes: i64,
}

/// How memory is measured in this process.
pub fn method() -> &'static str {
    if INSTALLED.load(Relaxed) {
        "counting_allocator (live requested heap bytes)"
    } else {
        "rss_delta (/proc/self/status VmRSS)"
    }
}

/// Current reading.
pub fn read() -> MemReading {
    if INSTALLED.load(Relaxed) {
        return MemReading {
            bytes: LIVE_BYTES.load(Relaxed) as i64,
        };
    }
    let rss_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<i64>().ok())
            })
        })
        .unwrap_or(0);
    MemReading {
        bytes: rss_kb * 1024,
    }
}

impl MemReading {
    /// Bytes gained since `earlier`.
    pub fn since(self, earlier: MemReading) -> i64 {
        self.bytes - earlier.bytes
    }
}

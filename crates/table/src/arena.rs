//! Row memory shared by the shards of one table: large 2 MiB-aligned regions (advised for
//! transparent huge pages, so random row access over GBs does not thrash the TLB), carved
//! into small fixed-size blocks that shards take one at a time. Sharing the regions keeps the
//! unused tail per shard at one small block instead of one large chunk.

use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;

use parking_lot::Mutex;

/// Huge-page size and region alignment.
const HUGE: usize = 2 << 20;
/// Largest region.
const MAX_REGION: usize = 64 << 20;

struct Region {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a region is an owned heap allocation with no thread affinity; the arena only hands
// out disjoint blocks of it.
unsafe impl Send for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc(self.layout)` and is freed exactly once, here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

struct Inner {
    regions: Vec<Region>,
    /// Next free byte in the last region, and bytes left there.
    next: usize,
    left: usize,
    total: usize,
}

/// Block allocator of one table. Blocks live as long as the arena (never freed individually).
pub struct Arena {
    block_bytes: usize,
    inner: Mutex<Inner>,
}

// SAFETY: all mutable state is behind the mutex; the raw region pointers are owned.
unsafe impl Sync for Arena {}

impl Arena {
    /// Arena handing out blocks of `block_bytes` (a multiple of 4).
    pub fn new(block_bytes: usize) -> Self {
        Arena {
            block_bytes,
            inner: Mutex::new(Inner {
                regions: Vec::new(),
                next: 0,
                left: 0,
                total: 0,
            }),
        }
    }

    /// Bytes of all regions.
    pub fn bytes(&self) -> usize {
        self.inner.lock().total
    }

    /// A fresh block of `block_bytes`, 4-byte aligned, contents uninitialised.
    pub fn block(&self) -> NonNull<u32> {
        let mut g = self.inner.lock();
        if g.left < self.block_bytes {
            // Regions grow with the table (1/64 of what is held) so the unused tail stays small.
            let want = (g.total / 64).clamp(HUGE, MAX_REGION).max(self.block_bytes);
            let size = want.div_ceil(HUGE) * HUGE;
            let layout = Layout::from_size_align(size, HUGE).expect("region layout");
            // SAFETY: `layout` has non-zero size.
            let ptr = unsafe { alloc(layout) };
            let Some(ptr) = NonNull::new(ptr) else {
                std::alloc::handle_alloc_error(layout)
            };
            advise_huge(ptr.as_ptr(), size);
            g.regions.push(Region { ptr, layout });
            g.next = ptr.as_ptr() as usize;
            g.left = size;
            g.total += size;
        }
        let p = g.next;
        g.next += self.block_bytes;
        g.left -= self.block_bytes;
        NonNull::new(p as *mut u32).expect("non-null block")
    }
}

#[cfg(target_os = "linux")]
fn advise_huge(p: *mut u8, len: usize) {
    // SAFETY: `p..p+len` is a live allocation we own; MADV_HUGEPAGE only changes how the
    // kernel backs it and MADV_POPULATE_WRITE only faults its pages in (as writing them
    // would, without changing a byte); neither invalidates contents. Failure is harmless:
    // plain pages, faulted in on first touch.
    unsafe {
        libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE);
        // One call faults the whole region in (Linux 5.14+; older kernels refuse it): rows
        // created one by one would otherwise take one page fault per page, and a first-touch
        // fault costs tens of microseconds in a VM (measured: table growth was 6-14 % of a
        // training run's CPU time).
        libc::madvise(p.cast(), len, libc::MADV_POPULATE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_p: *mut u8, _len: usize) {}

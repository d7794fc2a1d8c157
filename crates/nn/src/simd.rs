//! Elementwise loops compiled for AVX-512 where the CPU has it: the crate is built for the
//! baseline x86-64 (SSE2), so its loops vectorize 4 lanes wide unless they run inside a
//! function with wider target features. [`wide`] runs a closure inside such a function (mark
//! the closure `#[inline(always)]`, and what it calls in its loops, so they are compiled there
//! and vectorize 16 lanes wide); the operations per element are the same, so the results are
//! too.

/// Runs `f` compiled with AVX-512F when this CPU has it, else as built.
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU has AVX-512F (checked above); `avx512` only calls `f`.
        return unsafe { avx512(f) };
    }
    f()
}

//! Scheduling priority of the threads that feed the dense step (readers, the table's thread).
//!
//! The dense step's threads meet at a join every step. On a machine with no more cores than
//! busy threads, the scheduler slices a feeding thread into one dense thread's core: that
//! dense thread finishes its half late while the other core sits idle at the join (measured on
//! 2 cores: 12-16 % of each core idle in a WDL run, see BENCHMARKS.md). With a higher nice
//! value the feeding threads take the cores the dense threads leave idle instead, and their
//! queues (batches read ahead, lookups pulled ahead) absorb the wait.

/// Raises the calling thread's nice value by `increment` (capped at 19): a lower priority for
/// this thread only. Linux only, where the nice value is a thread's own; elsewhere (where it
/// is the whole process's) nothing. Best effort: a refusal is logged and changes nothing else.
pub fn lower_this_thread(increment: i32) {
    if increment <= 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        let Some(now) = read_nice() else {
            tracing::debug!("cannot read this thread's nice value");
            return;
        };
        let want = (now + increment).min(19);
        // SAFETY: setpriority writes the scheduling priority of one thread (this one, by its
        // id); no memory is passed.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, this_thread_id(), want) } != 0 {
            tracing::debug!(nice = want, "cannot lower this thread's priority");
        }
    }
}

/// The calling thread's nice value (Linux; 0 elsewhere, and where it cannot be read).
pub fn this_thread_nice() -> i32 {
    #[cfg(target_os = "linux")]
    {
        read_nice().unwrap_or(0)
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// The calling thread's nice value, `None` when the kernel refuses to say.
#[cfg(target_os = "linux")]
fn read_nice() -> Option<i32> {
    // SAFETY: getpriority reads one thread's priority (this one, by its id); no memory is
    // passed. errno is cleared first because -1 is a valid nice value.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, this_thread_id());
        (nice != -1 || *libc::__errno_location() == 0).then_some(nice)
    }
}

#[cfg(target_os = "linux")]
fn this_thread_id() -> libc::id_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as libc::id_t }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn lowering_changes_only_the_calling_threads_nice_value_and_stops_at_19() {
        let base = this_thread_nice();
        let (lowered, capped) = std::thread::spawn(move || {
            lower_this_thread(3);
            let lowered = this_thread_nice();
            lower_this_thread(40);
            (lowered, this_thread_nice())
        })
        .join()
        .unwrap();
        assert_eq!(lowered, (base + 3).min(19));
        assert_eq!(capped, 19);
        // The spawning thread (and so the process's other threads) keep theirs.
        assert_eq!(this_thread_nice(), base);
        lower_this_thread(0);
        assert_eq!(this_thread_nice(), base);
    }
}

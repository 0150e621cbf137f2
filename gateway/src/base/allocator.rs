//! Gives memory back to the system after a load. glibc's allocator keeps what the program
//! freed in its arenas, and returns only the free top of a heap: after an overload of 50,000
//! watchers the gateway stayed at its peak RSS (243 MiB against 23 MiB before) long after every
//! watcher had gone. `malloc_trim(0)` returns every whole free page of every arena
//! (`madvise`), which brought the same process back to 48 MiB.
//!
//! [`spawn_trimmer`] starts a thread that looks at the RSS every [`INTERVAL`] and trims once it
//! has stopped growing and stands [`MARGIN`] above where the last trim left it: after a load,
//! not during one, and never for nothing. A trim walks and locks each arena in turn, so it is
//! kept off the runtime's workers. Elsewhere than glibc it does nothing.

use std::time::{Duration, Instant};

/// How often the RSS is looked at.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Growth over the last trim's level that is worth a trim.
pub const MARGIN: u64 = 32 * 1024 * 1024;

/// Whether to trim now: the RSS stands `MARGIN` above the level the last trim left, and did
/// not grow since the last look (the load is over, or at least not growing).
pub fn due(rss: u64, last: u64, floor: u64) -> bool {
    rss > floor.saturating_add(MARGIN) && rss <= last
}

/// The process's resident set in bytes (`/proc/self/statm`), if it can be read.
pub fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages.saturating_mul(4096))
}

/// Returns the allocator's free pages to the system; true when it gave some back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code, reason = "glibc's malloc_trim has no safe binding")]
pub fn trim() -> bool {
    // SAFETY: `malloc_trim` takes no pointer and touches only the allocator's own state,
    // under the allocator's own locks (MT-Safe in glibc's manual).
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Returns the allocator's free pages to the system: nothing to do off glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}

/// Starts the thread that trims after loads (see the module doc).
pub fn spawn_trimmer() {
    let spawned = std::thread::Builder::new()
        .name("allocator-trim".into())
        .spawn(|| {
            let Some(mut floor) = rss() else {
                return;
            };
            let mut last = floor;
            loop {
                std::thread::sleep(INTERVAL);
                let Some(now) = rss() else {
                    return;
                };
                if due(now, last, floor) {
                    let started = Instant::now();
                    trim();
                    let after = rss().unwrap_or(now);
                    tracing::debug!(
                        before_mib = now / (1024 * 1024),
                        after_mib = after / (1024 * 1024),
                        took_ms = started.elapsed().as_millis(),
                        "returned free memory to the system"
                    );
                    floor = after;
                    last = after;
                } else {
                    last = now;
                    // A process that shrank on its own moves the floor down with it.
                    floor = floor.min(now);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start the allocator's trim thread");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::arithmetic_side_effects)]
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn trims_after_a_load_not_during_one() {
        // Growing: no trim, however high.
        assert!(!due(500 * MIB, 400 * MIB, 20 * MIB));
        // Stopped growing, well above the floor: trim.
        assert!(due(500 * MIB, 500 * MIB, 20 * MIB));
        assert!(due(480 * MIB, 500 * MIB, 20 * MIB));
        // Within the margin of the floor: nothing worth it.
        assert!(!due(40 * MIB, 40 * MIB, 20 * MIB));
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_memory_goes_back_to_the_system() {
        // Many small blocks (below glibc's mmap threshold, so they live in an arena), freed
        // but for one block in every 64 that pins each stretch of the heap: the allocator
        // keeps the pages, and only a trim gives them back. Run on a thread of its own so the
        // blocks come from an arena no other test is using.
        std::thread::spawn(|| {
            let before = rss().unwrap();
            let blocks: Vec<Vec<u8>> = (0..100_000).map(|i| vec![i as u8; 2048]).collect();
            let grown = rss().unwrap();
            assert!(grown > before + 150 * MIB, "{before} -> {grown}");
            let kept: Vec<Vec<u8>> = blocks
                .into_iter()
                .enumerate()
                .filter_map(|(i, b)| (i % 64 == 0).then_some(b))
                .collect();
            let freed = rss().unwrap();
            assert!(trim());
            let trimmed = rss().unwrap();
            assert!(
                trimmed + 100 * MIB < freed,
                "freed {} MiB, trimmed {} MiB",
                freed / MIB,
                trimmed / MIB
            );
            drop(kept);
        })
        .join()
        .unwrap();
    }
}

//! The process's allocator, and giving memory back to the system after a load.
//!
//! The gateway binary's allocator is mimalloc ([`Allocator`]). glibc's malloc kept free
//! holes between live allocations that it could not reuse: at 1,000,000 h2 watches about
//! 43,000 of 9.4 KB, 400 MB of 2.2 GB. mimalloc keeps each size class in pages of its own, so a
//! hole is only ever reused by its own size (BENCHMARKS, "1M h2 watches within their
//! targets").
//!
//! mimalloc returns a page's memory to the system a second after it falls empty, but only
//! when the thread that owns the page next allocates: after a load that ends in quiet, 100,000
//! watches closed left 226 MB of a 278 MB peak resident. [`spawn_trimmer`] starts a thread that
//! looks at the RSS every [`INTERVAL`] and trims once it has stopped growing and stands
//! [`MARGIN`] away from where the last trim left it, and again while a trim gives back more
//! than that ([`Looks`]): after a load, not while it grows, and never for nothing. A trim
//! purges what its own thread can, and asks every runtime thread to give its own pages back
//! the next time it has nothing to do ([`on_park`]), which costs each park one atomic load
//! otherwise.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the RSS is looked at.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// A move away from the level the last trim left that is worth a trim.
pub const MARGIN: u64 = 32 * 1024 * 1024;

/// Whether to trim now: the RSS did not grow since the last look (the load is over, or at
/// least not growing) and stands `MARGIN` away from `settled`, the level the last trim left.
/// Below it too: a trim taken during a load leaves the load's level, and what the load's end
/// freed stays with threads that then have nothing to do, until a trim asks them.
pub fn due(rss: u64, last: u64, settled: u64) -> bool {
    rss <= last && rss.abs_diff(settled) > MARGIN
}

/// When the trim thread trims, from the RSS it reads at each look.
#[derive(Debug)]
pub struct Looks {
    /// The level the last trim left.
    settled: u64,
    /// The RSS at the last look.
    last: u64,
    /// The RSS when the last trim was asked, until the next look reads what it left (every
    /// runtime thread then had an interval to park and give its pages back).
    trimmed: Option<u64>,
}

impl Looks {
    pub fn new(rss: u64) -> Self {
        Looks {
            settled: rss,
            last: rss,
            trimmed: None,
        }
    }

    /// The RSS read now; true when a trim is to be asked. A trim that gave back more than
    /// [`MARGIN`] is followed by another while the RSS does not grow: a load's end frees its
    /// memory over seconds, and a trim asked early in it leaves the rest with the threads.
    pub fn look(&mut self, now: u64) -> bool {
        let trim = match self.trimmed.take() {
            Some(before) => {
                self.settled = now;
                before.saturating_sub(now) > MARGIN && now <= self.last
            }
            None => due(now, self.last, self.settled),
        };
        if trim {
            self.trimmed = Some(now);
        }
        self.last = now;
        trim
    }
}

/// The process's resident set in bytes (`/proc/self/statm`), if it can be read.
pub fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages.saturating_mul(4096))
}

/// The gateway binary's global allocator (`main.rs`); this crate's unit tests run on it too.
/// The integration tests and benches that count allocations bring their own.
pub type Allocator = mimalloc::MiMalloc;

#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: Allocator = mimalloc::MiMalloc;

/// Trims asked for: each runtime thread collects once for each ([`on_park`]).
static TRIMS: AtomicU64 = AtomicU64::new(0);

/// The trims runtime threads made at a park.
static THREAD_TRIMS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The trims this thread collected for.
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

/// Returns this thread's empty pages to the system now, and every arena's, rather than at
/// the thread's next allocation a second or more later.
#[allow(unsafe_code, reason = "mimalloc's collection has no safe binding")]
pub fn trim() {
    // SAFETY: `mi_collect` takes no pointer; it frees the calling thread's empty pages and
    // purges every arena's, under mimalloc's own synchronisation (safe from any thread).
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Asks every runtime thread to trim at its next [`on_park`], and trims this one.
pub fn trim_all() {
    TRIMS.fetch_add(1, Ordering::Relaxed);
    trim();
}

/// For a runtime's `on_thread_park`: a thread about to wait for work trims once after each
/// [`trim_all`] (mimalloc gives a thread's pages back only on that thread).
pub fn on_park() {
    let asked = TRIMS.load(Ordering::Relaxed);
    COLLECTED.with(|done| {
        if done.get() != asked {
            done.set(asked);
            trim();
            THREAD_TRIMS.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Starts the thread that trims after loads (see the module doc).
pub fn spawn_trimmer() {
    let spawned = std::thread::Builder::new()
        .name("allocator-trim".into())
        .spawn(|| {
            let Some(start) = rss() else {
                return;
            };
            let mut looks = Looks::new(start);
            loop {
                std::thread::sleep(INTERVAL);
                let Some(now) = rss() else {
                    return;
                };
                if looks.look(now) {
                    tracing::debug!(rss_mib = now / (1024 * 1024), "trimming the allocator");
                    trim_all();
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

    /// The process's RSS is every test's: the tests that read it run one at a time.
    static RSS_TESTS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    #[test]
    fn trims_after_a_load_not_during_one() {
        // Growing: no trim, however high.
        assert!(!due(500 * MIB, 400 * MIB, 20 * MIB));
        // Stopped growing, well above the last trim's level: trim.
        assert!(due(500 * MIB, 500 * MIB, 20 * MIB));
        assert!(due(480 * MIB, 500 * MIB, 20 * MIB));
        // Within the margin of it: nothing worth it.
        assert!(!due(40 * MIB, 40 * MIB, 20 * MIB));
        // Well below the level a trim during the load left: the load's end is to trim.
        assert!(due(220 * MIB, 230 * MIB, 500 * MIB));
        assert!(!due(480 * MIB, 490 * MIB, 500 * MIB));
    }

    #[test]
    fn a_trim_that_gave_much_back_is_followed_by_another_until_one_gives_little() {
        let mut looks = Looks::new(40 * MIB);
        // A load: growing, then flat (one trim), then over.
        assert!(!looks.look(200 * MIB));
        assert!(looks.look(200 * MIB));
        assert!(
            looks.look(120 * MIB),
            "80 MiB came back: the load's end may hold more"
        );
        assert!(looks.look(60 * MIB), "60 more");
        assert!(!looks.look(50 * MIB), "10 more: settled");
        assert!(!looks.look(52 * MIB));
        // A trim that came back with the RSS growing again waits for it to stop.
        let mut looks = Looks::new(40 * MIB);
        looks.look(300 * MIB);
        assert!(looks.look(300 * MIB));
        assert!(
            !looks.look(350 * MIB),
            "growing again: the trim's level is 350"
        );
        assert!(!looks.look(400 * MIB), "growing");
        assert!(
            looks.look(400 * MIB),
            "flat, 50 above the level the trim left"
        );
    }

    #[test]
    fn freed_memory_goes_back_to_the_system_at_a_trim() {
        let _one = RSS_TESTS.lock();
        // 200 MiB of small blocks, freed but for one in 1,024: most of mimalloc's pages fall
        // empty, and a trim gives them back at once (mimalloc alone would wait a second and
        // for the next allocation; glibc's malloc would keep them).
        std::thread::spawn(|| {
            let before = rss().unwrap();
            let blocks: Vec<Vec<u8>> = (0..100_000).map(|i| vec![i as u8; 2048]).collect();
            let grown = rss().unwrap();
            assert!(grown > before + 150 * MIB, "{before} -> {grown}");
            let kept: Vec<Vec<u8>> = blocks
                .into_iter()
                .enumerate()
                .filter_map(|(i, b)| (i % 1024 == 0).then_some(b))
                .collect();
            let freed = rss().unwrap();
            trim();
            let trimmed = rss().unwrap();
            assert!(
                trimmed + 150 * MIB < freed,
                "freed {} MiB, trimmed {} MiB",
                freed / MIB,
                trimmed / MIB
            );
            drop(kept);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_runtime_thread_trims_once_when_it_next_parks_after_a_trim_is_asked() {
        let _one = RSS_TESTS.lock();
        std::thread::spawn(|| {
            let parks = |n| {
                let before = THREAD_TRIMS.load(Ordering::Relaxed);
                for _ in 0..n {
                    on_park();
                }
                THREAD_TRIMS.load(Ordering::Relaxed) - before
            };
            // Caught up with the trims asked so far, then idle: nothing to do.
            parks(1);
            assert_eq!(parks(3), 0);
            trim_all();
            assert_eq!(parks(3), 1, "once a trim asked, however often it parks");
            trim_all();
            trim_all();
            assert_eq!(parks(1), 1, "two asked while it worked: one trim");
        })
        .join()
        .unwrap();
    }
}

//! What a write takes from the world outside core: the time, new UIDs and the random
//! suffixes of `generateName`. Core asks an [`Ambient`] for them instead of reading the
//! clock or drawing entropy itself, as the watch cache and the rate limiter take time as a
//! parameter; so the same object and the same `Ambient` always prepare the same write.
//!
//! The gateway passes [`System`], the one implementation that reads the wall clock and the
//! thread's random generator; tests pass [`Fixed`], whose answers are a function of its
//! start time and how often it was asked.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::seq::IndexedRandom;

use crate::meta::Time;

/// The characters of a `generateName` suffix (Kubernetes' `utilrand.String`: no vowels, so
/// no words, and no digits that look like letters).
pub const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// The length of a `generateName` suffix.
pub const SUFFIX_LEN: usize = 5;

/// The time, new UIDs and random name suffixes, as a write needs them.
pub trait Ambient: Send + Sync {
    /// Now, at the API's second precision.
    fn now(&self) -> Time;
    /// A new `metadata.uid`.
    fn new_uid(&self) -> String;
    /// A `generateName` suffix: [`SUFFIX_LEN`] characters of [`SUFFIX_ALPHABET`].
    fn random_suffix(&self) -> String;
}

/// The real world: the wall clock, version-4 UUIDs and the thread's random generator.
#[derive(Clone, Copy, Debug, Default)]
pub struct System;

impl Ambient for System {
    fn now(&self) -> Time {
        Time::now()
    }

    fn new_uid(&self) -> String {
        uuid::Uuid::new_v4().to_string()
    }

    fn random_suffix(&self) -> String {
        let mut rng = rand::rng();
        (0..SUFFIX_LEN)
            .filter_map(|_| SUFFIX_ALPHABET.choose(&mut rng))
            .map(|&c| char::from(c))
            .collect()
    }
}

/// A deterministic world for tests: the time stands still at `now`, and UIDs and suffixes
/// are drawn from a counter (distinct for the first `27^5` suffixes and every UID).
#[derive(Debug)]
pub struct Fixed {
    now: Time,
    draws: AtomicU64,
}

impl Fixed {
    pub fn new(now: Time) -> Self {
        Fixed {
            now,
            draws: AtomicU64::new(0),
        }
    }

    fn next(&self) -> u64 {
        self.draws.fetch_add(1, Ordering::Relaxed)
    }
}

impl Ambient for Fixed {
    fn now(&self) -> Time {
        self.now
    }

    fn new_uid(&self) -> String {
        // The layout of a version-4 UUID, so code that parses UIDs accepts it.
        format!("00000000-0000-4000-8000-{:012x}", self.next())
    }

    fn random_suffix(&self) -> String {
        let base = SUFFIX_ALPHABET.len() as u64;
        let mut n = self.next();
        let mut out = String::with_capacity(SUFFIX_LEN);
        for _ in 0..SUFFIX_LEN {
            let digit = usize::try_from(n.checked_rem(base).unwrap_or(0)).unwrap_or(0);
            out.push(char::from(
                SUFFIX_ALPHABET.get(digit).copied().unwrap_or(b'b'),
            ));
            n = n.checked_div(base).unwrap_or(0);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_world_repeats_itself() {
        let t: Time = serde_json::from_value(serde_json::json!("2024-01-01T00:00:00Z")).unwrap();
        let (a, b) = (Fixed::new(t), Fixed::new(t));
        for _ in 0..3 {
            assert_eq!(a.now(), b.now());
            assert_eq!(a.new_uid(), b.new_uid());
            assert_eq!(a.random_suffix(), b.random_suffix());
        }
        assert_ne!(a.new_uid(), a.new_uid());
        assert_eq!(a.now(), t);
    }

    #[test]
    fn suffixes_use_the_alphabet() {
        let t: Time = serde_json::from_value(serde_json::json!("2024-01-01T00:00:00Z")).unwrap();
        for s in [System.random_suffix(), Fixed::new(t).random_suffix()] {
            assert_eq!(s.len(), SUFFIX_LEN);
            assert!(s.bytes().all(|c| SUFFIX_ALPHABET.contains(&c)), "{s}");
        }
        assert!(uuid::Uuid::parse_str(&Fixed::new(t).new_uid()).is_ok());
    }
}

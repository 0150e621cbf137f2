//! Deadlines without the panic of `Instant + Duration` on overflow: a duration too large to
//! add (a huge configured timeout) means about a century from now, that is, never.

use std::time::Duration;

/// An instant that a duration can be added to without overflowing.
pub trait Deadline: Copy {
    /// `self + after`, or `None` when that does not fit.
    fn checked(self, after: Duration) -> Option<Self>;

    /// `self + after`, saturating at about a century from now.
    fn later(self, after: Duration) -> Self {
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        self.checked(after)
            .or_else(|| self.checked(CENTURY))
            .unwrap_or(self)
    }
}

impl Deadline for std::time::Instant {
    fn checked(self, after: Duration) -> Option<Self> {
        self.checked_add(after)
    }
}

impl Deadline for tokio::time::Instant {
    fn checked(self, after: Duration) -> Option<Self> {
        self.checked_add(after)
    }
}

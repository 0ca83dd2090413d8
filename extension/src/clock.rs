//! The time a call writes: the clock, read once per call, the first time the call needs it.
//!
//! Queue order (`updated_at`, `retry_at`), leases (`started_at`, `deadline`) and the other times
//! a call writes on jobs and attempts come from here, never from `statement_timestamp()`. The
//! statement's start is a time the caller chooses: a statement kept open (a `DO` block that
//! sleeps, then submits) would date its writes before jobs other owners committed meanwhile,
//! ahead of them in the claimable queue. The clock is read lazily, so a call that first waits
//! for a job's row lock reads it after the wait, at the moment of its writes; and once, so that
//! every time one call writes (and the claim's and the retry's "is it due?") is the same
//! instant, not several clock reads microseconds apart.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use std::cell::Cell;

thread_local! {
    /// The current call's instant, once read; None before its first use and outside a call.
    static NOW: Cell<Option<pg_sys::TimestampTz>> = const { Cell::new(None) };
}

/// The current call's instant: the clock when the call first asked, then the same value.
pub fn now() -> TimestampWithTimeZone {
    let t = NOW.get().unwrap_or_else(|| {
        // SAFETY: reads the system clock, as clock_timestamp() does.
        let t = unsafe { pg_sys::GetCurrentTimestamp() };
        NOW.set(Some(t));
        t
    });
    TimestampWithTimeZone::try_from(t).expect("the clock is a finite timestamp")
}

/// Starts a call with no instant read yet; returns the one to restore when it ends.
pub(crate) fn enter() -> Option<pg_sys::TimestampTz> {
    NOW.replace(None)
}

/// Ends a call: puts back what [`enter`] returned.
pub(crate) fn leave(saved: Option<pg_sys::TimestampTz>) {
    NOW.set(saved);
}

//! The limits every layer must agree on (`docs/reference.md` § 9). The extension enforces
//! them; the client and the gateway check or cut inputs against the same numbers before
//! sending them.

/// The longest owner id, idempotency key, provider, contract, worker or contract name, in
/// characters (Unicode scalar values, as PostgreSQL's `char_length` counts them).
pub const MAX_NAME_CHARS: usize = 255;

/// The largest attempt number, and the largest `max_attempts`: it must fit in an attempt id's
/// last two bytes.
pub const MAX_ATTEMPT_NO: u32 = 65_535;

/// The `max_attempts` a job gets when none is given.
pub const DEFAULT_MAX_ATTEMPTS: u16 = 3;

/// The lease an attempt gets when none is given, in seconds.
pub const DEFAULT_LEASE_SECS: u64 = 30;

/// The longest free-text reason (`mark_unknown`, `abandon_attempt`, `cancel_job`,
/// `revoke_certification`), in characters.
pub const MAX_REASON_CHARS: usize = 1000;

/// The largest params, error, evidence or schema document, in bytes (detoasted). Params are
/// part of the fingerprint, compared on every replay; larger payloads belong in blob storage,
/// referenced from the document.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// The largest result, in bytes (detoasted). A result is written once and read back on
/// replays, so it may be larger than params.
pub const MAX_RESULT_BYTES: usize = 16 * 1024 * 1024;

/// The longest lease or heartbeat extension, in microseconds (one day, on the calendar). Long
/// work keeps its lease alive by heartbeats; a longer lease would hide a dead worker too long.
pub const MAX_LEASE_MICROS: i128 = 24 * 3600 * 1_000_000;

/// The most intents one `submit_jobs` call accepts.
pub const MAX_BATCH: usize = 10_000;

/// The most bytes of params one `submit_jobs` call takes (detoasted, all intents together).
pub const MAX_BATCH_PARAMS_BYTES: usize = 64 * 1024 * 1024;

/// The most bytes of stored results one `submit_jobs` call returns (detoasted, per row that
/// returns one); intents past it, in batch order, are refused with `54000`.
pub const MAX_BATCH_RESULT_BYTES: usize = 64 * 1024 * 1024;

/// The largest `batch_size` of `purge`.
pub const MAX_PURGE_BATCH: i32 = 100_000;

/// The most jobs one `claim_attempts` call begins.
pub const MAX_CLAIM: usize = 1000;

/// The longest `retry_after` of `fail_attempt`, in microseconds (30 days, on the clock).
pub const MAX_RETRY_AFTER_MICROS: i128 = 30 * 24 * 3600 * 1_000_000;

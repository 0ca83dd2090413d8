//! What every layer of pg_intent must agree on: the ids, the states and their transitions
//! ([`state`]), the limits ([`limits`]), the SQLSTATEs with their HTTP statuses
//! ([`sqlstate`]), and the facts a refusal carries ([`facts`]). The extension, the client, the
//! gateway and the tests all take them from here.
//!
//! ## Ids
//!
//! A job id is derived from the intent, never random, so that a load balancer, an API handler,
//! the database, a worker and a log line can all name a job before the database is asked
//! (see `docs/reference.md`, § 1.4 Identity and binding):
//!
//! ```text
//! h = SHA-256(UTF-8(owner_id) ‖ 0x00 ‖ UTF-8(idempotency_key))
//! b = h[0..16]; b[6] = b[6] & 0x0F | 0x80; b[8] = b[8] & 0x3F | 0x80; b[14] = b[15] = 0
//! ```
//!
//! An attempt id is its job id with the attempt number, big-endian, in the last two bytes, so an
//! attempt id always names its job. Keys are compared byte for byte, with no Unicode
//! normalisation, exactly as the database's unique constraint compares them.
//!
//! This crate has no dependency on PostgreSQL so that the extension, the client and any other
//! service compute the very same bytes.
#![warn(missing_docs)]

use sha2::{Digest, Sha256};

pub mod facts;
pub mod limits;
pub mod sqlstate;
pub mod state;

pub use facts::Facts;
pub use limits::{MAX_ATTEMPT_NO, MAX_NAME_CHARS};
pub use sqlstate::SqlState;
pub use state::{AttemptState, Completion, EventKind, FingerprintField, JobState, UnknownLabel};

/// Why an input cannot be turned into an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdError {
    /// `owner_id` is empty or longer than [`MAX_NAME_CHARS`] characters.
    OwnerLength(usize),
    /// `idempotency_key` is empty or longer than [`MAX_NAME_CHARS`] characters.
    KeyLength(usize),
    /// The attempt number is outside `1..=65535`.
    AttemptNo(i64),
    /// A job id was expected but the id carries an attempt number (its last two bytes are not zero).
    NotAJobId,
    /// An attempt id was expected but the id's last two bytes are zero (it is a job id).
    NotAnAttemptId,
}

impl std::fmt::Display for IdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdError::OwnerLength(n) => {
                write!(
                    f,
                    "owner_id must be 1 to {MAX_NAME_CHARS} characters long, got {n}"
                )
            }
            IdError::KeyLength(n) => write!(
                f,
                "idempotency_key must be 1 to {MAX_NAME_CHARS} characters long, got {n}"
            ),
            IdError::AttemptNo(n) => {
                write!(
                    f,
                    "attempt_no must be between 1 and {MAX_ATTEMPT_NO}, got {n}"
                )
            }
            IdError::NotAJobId => write!(f, "not a job id: its last two bytes must be zero"),
            IdError::NotAnAttemptId => {
                write!(
                    f,
                    "not an attempt id: its last two bytes hold no attempt number"
                )
            }
        }
    }
}

impl std::error::Error for IdError {}

fn check_len(s: &str, err: fn(usize) -> IdError) -> Result<(), IdError> {
    // Cheap upper bound first: a string of at most 255 bytes has at most 255 characters.
    if s.is_empty() {
        return Err(err(0));
    }
    if s.len() > MAX_NAME_CHARS {
        let n = s.chars().count();
        if n > MAX_NAME_CHARS {
            return Err(err(n));
        }
    }
    Ok(())
}

/// Checks an owner id's length as docs/reference.md § 9 requires (1–255 characters).
pub fn check_owner(owner_id: &str) -> Result<(), IdError> {
    check_len(owner_id, IdError::OwnerLength)
}

/// Checks an idempotency key's length as docs/reference.md § 9 requires (1–255 characters).
pub fn check_key(idempotency_key: &str) -> Result<(), IdError> {
    check_len(idempotency_key, IdError::KeyLength)
}

/// The job id of `(owner_id, idempotency_key)`, as 16 bytes, without checking lengths.
///
/// Use [`job_id`] unless the inputs are already known to be valid.
pub fn job_id_unchecked(owner_id: &str, idempotency_key: &str) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(owner_id.as_bytes());
    h.update([0u8]);
    h.update(idempotency_key.as_bytes());
    let digest = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0F) | 0x80; // version 8: "custom" (RFC 9562)
    b[8] = (b[8] & 0x3F) | 0x80; // RFC 9562 variant
    b[14] = 0;
    b[15] = 0;
    b
}

/// The job id of `(owner_id, idempotency_key)`, as 16 bytes (a UUID in network order).
pub fn job_id(owner_id: &str, idempotency_key: &str) -> Result<[u8; 16], IdError> {
    check_owner(owner_id)?;
    check_key(idempotency_key)?;
    Ok(job_id_unchecked(owner_id, idempotency_key))
}

/// The id of attempt `attempt_no` of `job_id`.
pub fn attempt_id(job_id: [u8; 16], attempt_no: i64) -> Result<[u8; 16], IdError> {
    if job_id[14] != 0 || job_id[15] != 0 {
        return Err(IdError::NotAJobId);
    }
    if !(1..=i64::from(MAX_ATTEMPT_NO)).contains(&attempt_no) {
        return Err(IdError::AttemptNo(attempt_no));
    }
    let mut b = job_id;
    b[14..16].copy_from_slice(&(attempt_no as u16).to_be_bytes());
    Ok(b)
}

/// The job an attempt id belongs to.
pub fn job_of(attempt_id: [u8; 16]) -> Result<[u8; 16], IdError> {
    if attempt_no_of(attempt_id) == 0 {
        return Err(IdError::NotAnAttemptId);
    }
    let mut b = attempt_id;
    b[14] = 0;
    b[15] = 0;
    Ok(b)
}

/// The attempt number carried in an id's last two bytes (0 for a job id).
pub fn attempt_no_of(id: [u8; 16]) -> u16 {
    u16::from_be_bytes([id[14], id[15]])
}

/// Formats 16 bytes the way PostgreSQL prints a `uuid`.
pub fn format_uuid(b: [u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{byte:02x}"));
    }
    s
}

/// Parses the way PostgreSQL prints a `uuid` (lower- or upper-case hex, with the four dashes).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-').collect();
    if s.len() != 36
        || hex.len() != 32
        || !hex.iter().all(u8::is_ascii_hexdigit)
        || [8, 13, 18, 23].iter().any(|&i| s.as_bytes()[i] != b'-')
    {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        b[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip() {
        let job = job_id("alice", "click-1").unwrap();
        assert_eq!(parse_uuid(&format_uuid(job)), Some(job));
        assert_eq!(parse_uuid(&format_uuid(job).to_uppercase()), Some(job));
        assert_eq!(parse_uuid("62ccd04c-f6e5-82dd-aeee-a9dac809000"), None);
        assert_eq!(parse_uuid("62ccd04cf-6e5-82dd-aeee-a9dac8090000"), None);
        assert_eq!(parse_uuid("+2ccd04c-f6e5-82dd-aeee-a9dac8090000"), None);
    }

    /// The test vectors of docs/reference.md § 1.4: every layer must reproduce them.
    const VECTORS: &[(&str, &str, &str)] = &[
        ("alice", "click-1", "62ccd04c-f6e5-82dd-aeee-a9dac8090000"),
        ("bob", "click-1", "7f0bee31-33f4-8d37-a75f-6be579b60000"),
        (
            "tenant-42",
            "order-2026-11-30-0001",
            "7a4ffde0-bffb-854b-acd8-945a08ef0000",
        ),
        ("ö", "ключ", "3978066c-a3db-84e2-8d3c-9400b3c00000"),
    ];

    #[test]
    fn spec_vectors() {
        for (owner, key, want) in VECTORS {
            assert_eq!(
                format_uuid(job_id(owner, key).unwrap()),
                *want,
                "{owner}/{key}"
            );
        }
    }

    #[test]
    fn attempt_ids_carry_their_job() {
        let job = job_id("alice", "click-1").unwrap();
        let a1 = attempt_id(job, 1).unwrap();
        assert_eq!(format_uuid(a1), "62ccd04c-f6e5-82dd-aeee-a9dac8090001");
        let a2 = attempt_id(job, 2).unwrap();
        assert_eq!(format_uuid(a2), "62ccd04c-f6e5-82dd-aeee-a9dac8090002");
        assert_eq!(job_of(a2).unwrap(), job);
        assert_eq!(attempt_no_of(attempt_id(job, 65_535).unwrap()), 65_535);
        assert_eq!(attempt_no_of(attempt_id(job, 258).unwrap()), 258);
    }

    #[test]
    fn bad_inputs_are_refused() {
        let job = job_id("alice", "click-1").unwrap();
        assert_eq!(job_id("", "k"), Err(IdError::OwnerLength(0)));
        assert_eq!(job_id("o", ""), Err(IdError::KeyLength(0)));
        assert_eq!(
            job_id(&"x".repeat(256), "k"),
            Err(IdError::OwnerLength(256))
        );
        // 255 characters of two bytes each are still 255 characters.
        assert!(job_id(&"é".repeat(255), "k").is_ok());
        assert_eq!(job_id("o", &"é".repeat(256)), Err(IdError::KeyLength(256)));
        assert_eq!(attempt_id(job, 0), Err(IdError::AttemptNo(0)));
        assert_eq!(attempt_id(job, 65_536), Err(IdError::AttemptNo(65_536)));
        assert_eq!(attempt_id(job, -1), Err(IdError::AttemptNo(-1)));
        let a1 = attempt_id(job, 1).unwrap();
        assert_eq!(attempt_id(a1, 2), Err(IdError::NotAJobId));
        assert_eq!(job_of(job), Err(IdError::NotAnAttemptId));
    }

    #[test]
    fn keys_are_compared_byte_for_byte() {
        // "é" precomposed and decomposed are different keys, as in the unique constraint.
        let a = job_id("o", "caf\u{e9}").unwrap();
        let b = job_id("o", "cafe\u{301}").unwrap();
        assert_ne!(a, b);
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(job_id("ab", "c").unwrap(), job_id("a", "bc").unwrap());
    }
}

//! Input checks. Every one runs before anything is read or written, and each failure is a
//! `22023` refusal that names the argument, what it got and what it needs.

use crate::jsonb::Jsonb;
use crate::refusal::{Answer, Refusal};
pub use pg_intent_protocol::limits::{
    MAX_ATTEMPT_NO, MAX_DOCUMENT_BYTES, MAX_LEASE_MICROS, MAX_NAME_CHARS, MAX_REASON_CHARS,
    MAX_RESULT_BYTES, MAX_RETRY_AFTER_MICROS,
};
use pgrx::datum::Interval;

pub fn required<T>(name: &str, value: Option<T>) -> Answer<T> {
    value.ok_or_else(|| {
        Refusal::bad_input(format!("{name} must not be NULL"))
            .detail(format!("The call passed NULL for {name}."))
            .hint(format!("Pass a value for {name}."))
    })
}

fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// A name-like text: 1 to 255 characters.
pub fn name<'a>(arg: &str, value: Option<&'a str>) -> Answer<&'a str> {
    let value = required(arg, value)?;
    let n = char_len(value);
    if n == 0 || n > MAX_NAME_CHARS {
        return Err(Refusal::bad_input(format!(
            "{arg} must be 1 to {MAX_NAME_CHARS} characters long"
        ))
        .detail(format!("{arg} has {n} characters.")));
    }
    Ok(value)
}

/// An optional name-like text: NULL, or 1 to 255 characters.
pub fn optional_name<'a>(arg: &str, value: Option<&'a str>) -> Answer<Option<&'a str>> {
    match value {
        None => Ok(None),
        some => name(arg, some).map(Some),
    }
}

/// A jsonb document no larger than [`MAX_DOCUMENT_BYTES`].
pub fn document(arg: &str, value: Option<Jsonb>) -> Answer<Jsonb> {
    sized_document(arg, value, MAX_DOCUMENT_BYTES)
}

/// A result document no larger than [`MAX_RESULT_BYTES`].
pub fn result(value: Option<Jsonb>) -> Answer<Jsonb> {
    sized_document("result", value, MAX_RESULT_BYTES)
}

fn sized_document(arg: &str, value: Option<Jsonb>, limit: usize) -> Answer<Jsonb> {
    let value = required(arg, value)?;
    let size = value.raw_size();
    if size > limit {
        return Err(Refusal::bad_input(format!("{arg} is too large"))
            .detail(format!(
                "{arg} is {size} bytes; the limit is {limit} bytes."
            ))
            .hint("Store large payloads elsewhere and pass a reference to them."));
    }
    Ok(value)
}

/// A positive lease of at most a day. PostgreSQL adds an interval's months and days on the
/// calendar (in the session's time zone) and its microseconds on the clock, so the parts are
/// checked one by one rather than by a total that assumes 30-day months: no negative part (the
/// deadline could then fall before the start), no months, and days plus time within one day.
/// '1 day' across a daylight-saving change is 23 or 25 hours, as the deadline will be.
pub fn lease(arg: &str, value: Option<Interval>) -> Answer<Interval> {
    let value = required(arg, value)?;
    let (months, days, micros) = (value.months(), value.days(), value.micros());
    let within_a_day = i128::from(days) * 86_400_000_000 + i128::from(micros);
    if months != 0 || days < 0 || micros < 0 || within_a_day <= 0 || within_a_day > MAX_LEASE_MICROS
    {
        return Err(Refusal::bad_input(format!(
            "{arg} must be positive and at most 24 hours"
        ))
        .detail(format!("{arg} is {value}."))
        .hint("Ask for a short lease and extend it with intent.heartbeat() while the work runs."));
    }
    Ok(value)
}

/// A `retry_after`: NULL (the default backoff), or zero to 30 days, checked part by part as
/// [`lease`] is: no months, no negative part.
pub fn retry_after(value: Option<Interval>) -> Answer<Option<Interval>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let (months, days, micros) = (value.months(), value.days(), value.micros());
    let total = i128::from(days) * 86_400_000_000 + i128::from(micros);
    if months != 0 || days < 0 || micros < 0 || total > MAX_RETRY_AFTER_MICROS {
        return Err(
            Refusal::bad_input("retry_after must be between 0 and 30 days")
                .detail(format!("retry_after is {value}."))
                .hint("Pass NULL for the default backoff (intent.retry_backoff)."),
        );
    }
    Ok(Some(value))
}

/// Whether every part of an interval is small enough (under ten thousand years) that adding it
/// to a timestamp cannot leave the timestamp range: PostgreSQL would raise 22008 there.
pub fn within_ten_thousand_years(v: &Interval) -> bool {
    const YEARS: i64 = 10_000;
    i64::from(v.months()).abs() <= 12 * YEARS
        && i64::from(v.days()).abs() <= 366 * YEARS
        && v.micros().unsigned_abs() <= (366 * YEARS * 86_400_000_000) as u64
}

/// max_attempts: 1 to 65535 (an attempt number must fit in the attempt id's last two bytes).
pub fn max_attempts(value: Option<i32>) -> Answer<i32> {
    let value = required("max_attempts", value)?;
    if !(1..=MAX_ATTEMPT_NO as i32).contains(&value) {
        return Err(Refusal::bad_input(format!(
            "max_attempts must be between 1 and {MAX_ATTEMPT_NO}"
        ))
        .detail(format!("max_attempts is {value}.")));
    }
    Ok(value)
}

/// A reason: NULL if allowed, else 1 to 1000 characters.
pub fn reason(value: Option<&str>, required_: bool) -> Answer<Option<&str>> {
    match value {
        None if required_ => Err(required::<()>("reason", None)
            .unwrap_err()
            .hint("Say why, for the people who will read intent.events later.")),
        None => Ok(None),
        Some(r) => {
            let n = char_len(r);
            if n == 0 || n > MAX_REASON_CHARS {
                return Err(Refusal::bad_input(format!(
                    "reason must be 1 to {MAX_REASON_CHARS} characters long"
                ))
                .detail(format!("reason has {n} characters.")));
            }
            Ok(Some(r))
        }
    }
}

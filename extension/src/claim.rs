//! Workers: `claim_attempts` (the database as the dispatcher), the retry backoff settings, and
//! the `intent_claimable` notification.
//!
//! A claim is `begin_attempt` for jobs the database picks: pending, attempts left, retry time
//! passed, longest-waiting first. It locks the jobs it takes `FOR NO KEY UPDATE SKIP LOCKED`, as
//! every call locks a job before changing it, but never waits for one another transaction holds:
//! concurrent claimers take disjoint jobs. It scans the partial index `jobs_claimable_since`, whose
//! size is the queue's, whatever the number of finished jobs.

use crate::claim_start;
use crate::entry::{arg, one_row_each};
use crate::input;
use crate::refusal::{Answer, Refusal};
use crate::store::{self, ClaimAsk, Claimed};
use pg_intent_protocol::limits::MAX_CLAIM;
use pgrx::IntoDatum;
use pgrx::datum::Interval;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;

/// `intent.retry_backoff`: the first retry's delay; read by the statements as an interval.
static RETRY_BACKOFF: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"1 second"));
/// `intent.retry_backoff_max`: the longest default delay.
static RETRY_BACKOFF_MAX: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"5 minutes"));
/// `intent.notify`: whether a job that becomes claimable at once sends `NOTIFY intent_claimable`.
/// Off by default: NOTIFY serializes committing transactions on a cluster-wide lock (submit
/// throughput at 8 clients fell to 0.27–0.45 of itself, docs/benchmarks.md), a transaction that
/// notified cannot `PREPARE TRANSACTION`, and every role may LISTEN on the channel.
static NOTIFY: GucSetting<bool> = GucSetting::<bool>::new(false);

/// The channel idle workers `LISTEN` on.
pub const CHANNEL: &str = "intent_claimable";

/// The default backoff's settings, checked as `retry_after` is (0 to 30 days, no month part, no
/// negative part), in seconds: `(first delay, longest delay)`. A malformed value is PostgreSQL's
/// own interval error (22007); one out of bounds is refused with 22023.
pub fn backoff_settings() -> Answer<(f64, f64)> {
    let read = |name: &str, setting: &GucSetting<Option<CString>>, default: &std::ffi::CStr| {
        let text = setting.get().unwrap_or_else(|| default.to_owned());
        // SAFETY: interval_in(cstring, oid, int4), as PostgreSQL's own input calls it.
        let value = unsafe {
            pgrx::direct_function_call::<Interval>(
                pg_sys::interval_in,
                &[
                    pg_sys::Datum::from(text.as_ptr()).into(),
                    pg_sys::InvalidOid.into_datum(),
                    (-1i32).into_datum(),
                ],
            )
        }
        .expect("interval_in returns a value");
        match crate::input::retry_after(Some(value)) {
            Ok(_) => Ok(value.days() as f64 * 86_400.0 + value.micros() as f64 / 1e6),
            Err(_) => Err(
                Refusal::bad_input(format!("{name} must be between 0 and 30 days"))
                    .detail(format!("{name} is {value}."))
                    .hint(format!(
                        "RESET {name}, or set it to an interval of at most 30 days."
                    )),
            ),
        }
    };
    Ok((
        read("intent.retry_backoff", &RETRY_BACKOFF, c"1 second")?,
        read("intent.retry_backoff_max", &RETRY_BACKOFF_MAX, c"5 minutes")?,
    ))
}

/// Registers the worker settings; called from `_PG_init`.
pub fn register() {
    GucRegistry::define_string_guc(
        c"intent.retry_backoff",
        c"The delay before a job is claimable again after its first retryable failure (an interval).",
        c"Doubled for each further failed attempt of the job, up to intent.retry_backoff_max. Used when fail_attempt gets no retry_after.",
        &RETRY_BACKOFF,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"intent.retry_backoff_max",
        c"The longest delay the default backoff gives (an interval).",
        c"Caps intent.retry_backoff doubled per failed attempt.",
        &RETRY_BACKOFF_MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"intent.notify",
        c"Whether pg_intent sends NOTIFY intent_claimable when a job becomes claimable at once.",
        c"The payload is the job's provider; it is delivered at commit. Off (the default): workers poll.",
        &NOTIFY,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// Tells idle workers that a job of `provider` is claimable now (at commit), unless
/// `intent.notify` is off. NOTIFY folds identical notifications of one transaction into one.
pub fn notify_claimable(provider: &str) {
    if !NOTIFY.get() {
        return;
    }
    // pg_notify through the function manager: PostgreSQL's own checks and errors, under pgrx's
    // guard (a direct Async_Notify is not in pgrx's bindings).
    // SAFETY: pg_notify(text, text) with two text datums, as its SQL signature says.
    unsafe {
        pgrx::direct_function_call::<()>(
            pg_sys::pg_notify,
            &[CHANNEL.into_datum(), provider.into_datum()],
        );
    }
}

crate::entry::sql_function!(claim_attempts, claim_attempts);

/// `intent.claim_attempts(providers, worker, lease, max_jobs)`.
fn claim_attempts(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let providers: Option<Vec<Option<String>>> = arg(fcinfo, 0);
    let worker: Option<&str> = arg(fcinfo, 1);
    let lease: Option<Interval> = arg(fcinfo, 2);
    let max_jobs: Option<i32> = arg(fcinfo, 3);
    let claimed = claim(providers, worker, lease, max_jobs)?;
    Ok(one_row_each(fcinfo, claimed.len(), |i, _| {
        let c = &claimed[i];
        vec![
            c.job_id.into_datum(),
            c.attempt_id.into_datum(),
            c.attempt_no.into_datum(),
            c.version.into_datum(),
            c.deadline.into_datum(),
            c.provider.as_str().into_datum(),
            c.params.into_datum(),
            c.contract.as_deref().into_datum(),
        ]
    }))
}

fn claim(
    providers: Option<Vec<Option<String>>>,
    worker: Option<&str>,
    lease: Option<Interval>,
    max_jobs: Option<i32>,
) -> Answer<Vec<Claimed>> {
    let providers = match providers {
        None => None,
        Some(list) => Some(
            list.iter()
                .map(|p| input::name("providers", p.as_deref()).map(str::to_string))
                .collect::<Answer<Vec<String>>>()?,
        ),
    };
    let worker = input::optional_name("worker", worker)?;
    let lease = input::lease("lease", lease)?;
    let max_jobs = input::required("max_jobs", max_jobs)?;
    if !(1..=MAX_CLAIM as i32).contains(&max_jobs) {
        return Err(
            Refusal::bad_input(format!("max_jobs must be between 1 and {MAX_CLAIM}"))
                .detail(format!("max_jobs is {max_jobs}.")),
        );
    }
    let queue = claim_start::Queue {
        providers: providers.clone(),
        owner: crate::owner::bound_owner(),
    };
    let ask = ClaimAsk {
        providers,
        worker: worker.map(str::to_string),
        lease,
        max_jobs,
        start: claim_start::start(&queue),
    };
    let claimed = Spi::connect_mut(|client| store::get().claim(client, &ask));
    let newest = claimed
        .iter()
        .map(|c| c.since)
        .max_by_key(|t| t.into_inner());
    claim_start::claimed(&queue, ask.start, newest);
    Ok(claimed)
}

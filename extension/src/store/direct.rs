//! The replay lookup of `submit_job`, done with a direct primary-key index fetch.
//!
//! A replay (the double click, the retry) needs one row by its primary key. Through SPI that
//! costs a whole executor start-up per call (plan checks, scan and projection set-up, the owner
//! isolation policy's sub-plan) for a single index probe; profiling showed the start-up at
//! several times the probe. This module fetches the row the way an index scan does, under the
//! same snapshot rules:
//!
//! - a fresh snapshot under READ COMMITTED (after a `CommandCounterIncrement`, as SPI does
//!   before each statement, so rows written earlier in the transaction are seen), the
//!   transaction's snapshot under REPEATABLE READ and SERIALIZABLE (whose predicate locks the
//!   index and heap access methods take themselves);
//! - owner isolation applied explicitly, since row-level security is a planner feature: a
//!   session bound to another owner does not see the row, exactly as the policy would hide it.

use super::{Comparison, Found, Intent};
use crate::jsonb::Jsonb;
use crate::owner;
use pgrx::pg_sys;
use pgrx::{FromDatum, Uuid};
use std::cell::Cell;

/// The columns read, by attribute number, resolved once per table.
#[derive(Clone, Copy)]
struct Columns {
    relid: pg_sys::Oid,
    owner_id: i16,
    idempotency_key: i16,
    provider: i16,
    params: i16,
    contract: i16,
    state: i16,
    version: i16,
    result: i16,
}

thread_local! {
    static COLUMNS: Cell<Option<Columns>> = const { Cell::new(None) };
}

unsafe fn columns(relid: pg_sys::Oid) -> Columns {
    if let Some(c) = COLUMNS.get().filter(|c| c.relid == relid) {
        return c;
    }
    let att = |name: &std::ffi::CStr| unsafe {
        let n = pg_sys::get_attnum(relid, name.as_ptr());
        assert!(n > 0, "pg_intent: intent.jobs has no column {name:?}");
        n
    };
    let c = Columns {
        relid,
        owner_id: att(c"owner_id"),
        idempotency_key: att(c"idempotency_key"),
        provider: att(c"provider"),
        params: att(c"params"),
        contract: att(c"contract"),
        state: att(c"state"),
        version: att(c"version"),
        result: att(c"result"),
    };
    COLUMNS.set(Some(c));
    c
}

/// Fetches the row of `table` whose uuid primary key (`index`) is `id`, visible to the statement
/// snapshot, and hands its slot (all attributes deformed) to `read`. None when there is none.
unsafe fn with_row<T>(
    table: &std::ffi::CStr,
    index: &std::ffi::CStr,
    id: Uuid,
    read: impl FnOnce(pg_sys::Oid, *mut pg_sys::TupleTableSlot) -> Option<T>,
) -> Option<T> {
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"intent".as_ptr(), false);
        let relid = pg_sys::get_relname_relid(table.as_ptr(), ns);
        let indexid = pg_sys::get_relname_relid(index.as_ptr(), ns);
        assert!(
            relid != pg_sys::InvalidOid && indexid != pg_sys::InvalidOid,
            "pg_intent: intent.{table:?} or its primary key is missing"
        );
        pg_sys::CommandCounterIncrement();
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let idx = pg_sys::index_open(indexid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
        #[cfg(not(feature = "pg18"))]
        let scan = pg_sys::index_beginscan(rel, idx, snapshot, 1, 0);
        #[cfg(feature = "pg18")]
        let scan = pg_sys::index_beginscan(rel, idx, snapshot, std::ptr::null_mut(), 1, 0);
        let mut scankey: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyInit(
            &mut scankey,
            1,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_UUID_EQ),
            pgrx::IntoDatum::into_datum(id).expect("a uuid datum"),
        );
        pg_sys::index_rescan(scan, &mut scankey, 1, std::ptr::null_mut(), 0);
        let found = if pg_sys::index_getnext_slot(
            scan,
            pg_sys::ScanDirection::ForwardScanDirection,
            slot,
        ) {
            pg_sys::slot_getsomeattrs_int(slot, (*(*slot).tts_tupleDescriptor).natts);
            read(relid, slot)
        } else {
            None
        };
        pg_sys::index_endscan(scan);
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        // The locks are kept to the end of the transaction, as the executor keeps them.
        pg_sys::index_close(idx, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::UnregisterSnapshot(snapshot);
        found
    }
}

/// Attribute `attnum` of a deformed slot: (datum, isnull).
unsafe fn value(slot: *mut pg_sys::TupleTableSlot, attnum: i16) -> (pg_sys::Datum, bool) {
    let i = (attnum - 1) as usize;
    unsafe { (*(*slot).tts_values.add(i), *(*slot).tts_isnull.add(i)) }
}

unsafe fn text(slot: *mut pg_sys::TupleTableSlot, attnum: i16) -> Option<String> {
    unsafe {
        let (d, isnull) = value(slot, attnum);
        String::from_datum(d, isnull)
    }
}

/// The job with this id, compared with the submitted intent; None when there is none (or it
/// belongs to an owner this session is not bound to).
pub fn find_job(intent: &Intent<'_>) -> Option<Found> {
    let Intent {
        job_id,
        owner_id,
        key,
        provider,
        params,
        contract,
    } = *intent;
    unsafe {
        with_row(c"jobs", c"jobs_pkey", job_id, |relid, slot| {
            let cols = columns(relid);
            let row_owner = text(slot, cols.owner_id).expect("owner_id is NOT NULL");
            if owner::bound_owner().is_some_and(|bound| bound != row_owner) {
                return None;
            }
            let (row_params, _) = value(slot, cols.params);
            let same_params = pgrx::fcinfo::direct_function_call::<bool>(
                pg_sys::jsonb_eq,
                &[Some(row_params), pgrx::IntoDatum::into_datum(params)],
            )
            .expect("jsonb_eq returns a boolean");
            let state = pgrx::fcinfo::direct_function_call::<&std::ffi::CStr>(
                pg_sys::enum_out,
                &[Some(value(slot, cols.state).0)],
            )
            .and_then(|label| label.to_str().ok()?.parse().ok())
            .expect("state is a job_state label");
            let (result, result_null) = value(slot, cols.result);
            Some(Found {
                comparison: Comparison {
                    same_key: row_owner == owner_id
                        && text(slot, cols.idempotency_key).as_deref() == Some(key),
                    same_provider: text(slot, cols.provider).as_deref() == Some(provider),
                    same_params,
                    same_contract: text(slot, cols.contract).as_deref() == contract,
                },
                state,
                version: i64::from_datum(value(slot, cols.version).0, false)
                    .expect("version is NOT NULL"),
                // Copied (and detoasted) out of the buffer the slot pins, into the memory of
                // the API call: this runs inside SPI, whose memory is gone by the time the
                // call returns the result.
                result: Jsonb::from_datum_in_memory_context(
                    pgrx::PgMemoryContexts::For(crate::entry::caller_memory()),
                    result,
                    result_null,
                    pg_sys::JSONBOID,
                ),
            })
        })
    }
}

/// The last version a purged job with this id handed out (its tombstone in
/// intent.retired_keys), if any.
pub fn retired_version(job_id: Uuid) -> Option<i64> {
    unsafe {
        with_row(c"retired_keys", c"retired_keys_pkey", job_id, |_, slot| {
            // retired_keys is (id, version, retired_at).
            i64::from_datum(value(slot, 2).0, false)
        })
    }
}

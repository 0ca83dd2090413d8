//! Contracts: what a job's result must satisfy before it can win (docs/protocol.md § Contracts and failover).
//!
//! A result is checked against the contract's JSON Schema (draft 2020-12), then by its optional
//! SQL checker. Schemas are compiled once per backend and cached per contract version, so a
//! redefinition takes effect at once and an unchanged contract is never compiled twice.

use crate::entry::{arg, one_row, value};
use crate::input;
use crate::jsonb::{CallJsonb, Jsonb};
use crate::plans::{self, Statement};
use crate::refusal::{Answer, Refusal};
use pgrx::IntoDatum;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// The error kind recorded on an attempt whose result broke the job's contract.
pub const VIOLATION: &str = "contract_violation";

/// How many validation errors are kept on a rejected attempt; the first ones tell the story.
const MAX_ERRORS: usize = 20;

/// The contract's version, checker and schema. The schema is read every time: the compiled
/// validator is cached per backend, keyed by the schema itself (see [`validator`]).
///
/// The checker is stored by its identity (`pg_identify_object`: schema-qualified name and
/// argument types), not by oid: pg_upgrade keeps no function oids and refuses tables with
/// `regprocedure` columns. It is found again here in the catalog, by schema and name (from
/// `parse_ident`, which reads the quoting `pg_identify_object` writes) and the one argument
/// every checker takes, and confirmed by its identity; not with `to_regprocedure`, which
/// would need USAGE on the checker's schema for the role running the call. NULL in the
/// second column with a non-NULL sixth is a checker that no longer exists (or was renamed).
static CONTRACT: Statement = Statement {
    name: "Contract",
    sql: "SELECT c.version,
                 (SELECT p.oid
                    FROM pg_catalog.pg_proc p
                    JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                   WHERE p.proname = (pg_catalog.parse_ident(c.checker, false))[2]::pg_catalog.name
                     AND n.nspname = (pg_catalog.parse_ident(c.checker, false))[1]::pg_catalog.name
                     AND p.pronargs = 1
                     AND (pg_catalog.pg_identify_object('pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, 0)).identity
                         = c.checker),
                 c.output_schema, c.checker_owner::oid, c.defined_by::oid, c.checker
            FROM intent.contracts c WHERE c.name = $1",
    args: &[pg_sys::TEXTOID],
};

fn contract_statement() -> &'static Statement {
    crate::store::compat::contract(&CONTRACT)
}

/// Whether the role calling define_contract may execute the checker it names, and has the
/// rights of the checker's owner (the checker runs as its owner: naming it must not lend the
/// definer, nor every caller of validate_result, rights the definer does not have); the
/// checker's identity, as the contract stores it; whether it is a temporary function.
static CALLER_MAY_USE: Statement = Statement {
    name: "CallerMayUse",
    sql: "SELECT has_function_privilege($2, p.oid, 'EXECUTE'),
                 pg_has_role($2, p.proowner, 'USAGE'),
                 p.proowner::regrole::text,
                 (pg_catalog.pg_identify_object('pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, 0)).identity,
                 p.pronamespace = pg_catalog.pg_my_temp_schema()
                   OR pg_catalog.pg_is_other_temp_schema(p.pronamespace)
            FROM pg_catalog.pg_proc p WHERE p.oid = $1",
    args: &[pg_sys::OIDOID, pg_sys::OIDOID],
};

/// Defines a contract, or redefines it: version + 1 when the schema, the checker or the role
/// the checker runs as changed (certifications were earned on the old one). Defined again
/// unchanged by another role, it records the new definer (vetted just now) and keeps its
/// version; defined again unchanged by the same role, it writes nothing. So "redefine the
/// contract" re-vets a contract whose checker changed owner or whose definer lost rights. The
/// row's new `updated_at` is the statement timestamp the VALUES already carry
/// (`excluded.updated_at`): Citus refuses a function in the `DO UPDATE SET` of a reference table.
static UPSERT_CONTRACT: Statement = Statement {
    name: "UpsertContract",
    sql: "INSERT INTO intent.contracts AS c (name, output_schema, checker, created_at, updated_at,
                                              checker_owner, defined_by)
          VALUES ($1, $2, $3, statement_timestamp(), statement_timestamp(),
                  $4::regrole, $5::regrole)
          ON CONFLICT (name) DO UPDATE
             SET output_schema = excluded.output_schema, checker = excluded.checker,
                 checker_owner = excluded.checker_owner, defined_by = excluded.defined_by,
                 version = c.version + CASE
                     WHEN c.output_schema IS DISTINCT FROM excluded.output_schema
                       OR c.checker IS DISTINCT FROM excluded.checker
                       OR c.checker_owner IS DISTINCT FROM excluded.checker_owner THEN 1 ELSE 0 END,
                 updated_at = excluded.updated_at
           WHERE c.output_schema IS DISTINCT FROM excluded.output_schema
              OR c.checker IS DISTINCT FROM excluded.checker
              OR c.checker_owner IS DISTINCT FROM excluded.checker_owner
              OR c.defined_by IS DISTINCT FROM excluded.defined_by
          RETURNING version",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
        pg_sys::OIDOID,
        pg_sys::OIDOID,
    ],
};

static CERTIFY: Statement = Statement {
    name: "Certify",
    sql: "INSERT INTO intent.certifications (provider, contract, contract_version, evidence, certified_at, expires_at)
          VALUES ($1, $2, $3, $4, statement_timestamp(), statement_timestamp() + $5)
          RETURNING expires_at",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::INT4OID, pg_sys::JSONBOID, pg_sys::INTERVALOID],
};

/// The longest certification is 366 days: evidence gets stale, providers change their models.
static VALIDITY_OK: Statement = Statement {
    name: "ValidityOk",
    sql: "SELECT $1 > interval '0'
             AND statement_timestamp() + $1 <= statement_timestamp() + interval '366 days'",
    args: &[pg_sys::INTERVALOID],
};

static REVOKE: Statement = Statement {
    name: "Revoke",
    // Whether there is a current certification is decided by the newest of the pair (the one
    // that counts); when there is, every standing row of the pair is withdrawn, so that nothing
    // of the provider's standing for the contract is left.
    sql: "UPDATE intent.certifications c
             SET revoked_at = statement_timestamp(), revoked_reason = $3
           WHERE c.provider = $1 AND c.contract = $2
             AND c.revoked_at IS NULL AND c.expires_at > statement_timestamp()
             AND (SELECT n.revoked_at IS NULL AND n.expires_at > statement_timestamp()
                         AND n.contract_version = (SELECT k.version FROM intent.contracts k
                                                    WHERE k.name = $2)
                    FROM intent.certifications n
                   WHERE n.provider = $1 AND n.contract = $2
                   ORDER BY n.id DESC LIMIT 1)
          RETURNING c.id",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
};

/// The certification that counts for a failover: the newest for (provider, contract).
static CERTIFICATION: Statement = Statement {
    name: "Certification",
    sql: "SELECT c.contract_version, c.expires_at <= statement_timestamp(), c.expires_at::text,
                 c.revoked_at::text, c.revoked_reason, k.version
            FROM intent.certifications c
            JOIN intent.contracts k ON k.name = c.contract
           WHERE c.provider = $1 AND c.contract = $2
           ORDER BY c.id DESC LIMIT 1",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
};

thread_local! {
    /// Compiled schemas, per contract name, with the schema (its jsonb bytes) they were
    /// compiled from. Keyed by the schema itself rather than by a version or a row version: a
    /// contract redefined in the same transaction, or back and forth, or a frozen row, can never
    /// serve a stale validator.
    static VALIDATORS: RefCell<HashMap<String, (Vec<u8>, Rc<jsonschema::Validator>)>> =
        RefCell::new(HashMap::new());
}

/// The compiled schema of a contract; Err when the stored schema does not compile (any more: a
/// contract defined by an earlier release may use what this one refuses, such as a pattern that
/// needs backtracking or a `$ref` off the schema positions).
fn validator(name: &str, schema: Jsonb) -> Result<Rc<jsonschema::Validator>, String> {
    let bytes = schema.bytes();
    if let Some(v) = VALIDATORS.with_borrow(|m| {
        m.get(name)
            .filter(|(cached, _)| *cached == bytes)
            .map(|(_, v)| v.clone())
    }) {
        return Ok(v);
    }
    let compiled = Rc::new(schema.to_value().and_then(|v| crate::schema::compile(&v))?);
    VALIDATORS.with_borrow_mut(|m| m.insert(name.to_string(), (bytes, compiled.clone())));
    Ok(compiled)
}

/// How many schema positions collecting the errors of one invalid result may visit: enough for
/// every ordinary schema and result; a schema whose errors multiply with its nesting would
/// otherwise take gigabytes to list them.
const ERROR_VISITS: usize = 200_000;

/// Why a result breaks a contract.
pub struct Violation {
    pub version: i32,
    pub errors: Vec<Value>,
}

impl Violation {
    /// The error document recorded on a rejected attempt and in the event log.
    pub fn to_error(&self, contract: &str) -> Value {
        json!({
            "kind": VIOLATION,
            "contract": contract,
            "contract_version": self.version,
            "errors": self.errors,
        })
    }
}

/// Validates a result: schema first, then the checker. None when the contract does not exist.
pub fn validate(
    client: &mut SpiClient<'_>,
    name: &str,
    result: Jsonb,
) -> Option<Result<(), Violation>> {
    let row = plans::first(plans::run(client, contract_statement(), &[name.into()]))?;
    let version: i32 = plans::must(&row, 1);
    let checker: Option<pg_sys::Oid> = plans::get(&row, 2);
    let checker_owner: Option<pg_sys::Oid> = plans::get(&row, 4);
    let defined_by: Option<pg_sys::Oid> = plans::get(&row, 5);
    let checker_identity: Option<String> = plans::get(&row, 6);
    let validator = match validator(name, plans::must::<CallJsonb>(&row, 3).0) {
        Ok(v) => v,
        Err(e) => {
            return Some(Err(Violation {
                version,
                errors: vec![json!({"path": "", "message": format!(
                    "the contract's schema cannot be used by this version of pg_intent ({e}): redefine the contract"
                )})],
            }));
        }
    };
    let value = match result.to_value() {
        Ok(value) => value,
        // A result that cannot be read cannot be shown to satisfy the contract.
        Err(e) => {
            return Some(Err(Violation {
                version,
                errors: vec![json!({"path": "", "message": format!("cannot be validated: {e}")})],
            }));
        }
    };
    // is_valid stops at the first failure and allocates nothing; only an invalid result has its
    // errors collected, within a budget.
    if !validator.is_valid(&value) {
        let errors = crate::schema::with_error_budget(ERROR_VISITS, || {
            validator
                .iter_errors(&value)
                .take(MAX_ERRORS)
                .map(|e| json!({"path": e.instance_path().to_string(), "message": e.to_string()}))
                .collect::<Vec<Value>>()
        })
        .filter(|errors| !errors.is_empty())
        .unwrap_or_else(|| {
            vec![json!({"path": "", "message": "the result does not satisfy the schema (its errors were too many to list)"})]
        });
        return Some(Err(Violation { version, errors }));
    }
    if checker.is_none()
        && let Some(identity) = checker_identity
    {
        return Some(Err(Violation {
            version,
            errors: vec![json!({"checker": format!(
                "checker {identity} no longer exists (a checker is found by its schema-qualified name and argument types: renaming it, or its schema, detaches it): redefine the contract"
            )})],
        }));
    }
    // A checker sees no owner's rows: it judges the result it is given, nothing else.
    if let Some(checker) = checker
        && let Err(complaint) = crate::owner::without_owner(|| {
            crate::checker::run(checker, checker_owner, defined_by, result)
        })
    {
        return Some(Err(Violation {
            version,
            errors: vec![json!({"checker": complaint})],
        }));
    }
    Some(Ok(()))
}

/// `intent.allow_checker_drop`: read by the drop guard (`sql/contracts_api.sql`), which lets a
/// session that turns it on drop a function a contract uses as its checker. Defined here so
/// that `SHOW` knows it and a value is checked; the guard reads it as a placeholder too.
static ALLOW_CHECKER_DROP: pgrx::guc::GucSetting<bool> = pgrx::guc::GucSetting::<bool>::new(false);

/// Registers `intent.allow_checker_drop`; called from `_PG_init`.
pub fn register() {
    pgrx::guc::GucRegistry::define_bool_guc(
        c"intent.allow_checker_drop",
        c"Lets this session drop functions that contracts use as checkers (for pg_restore --clean).",
        c"Off: DROP of a contract's checker is refused (2BP01). On: the drop goes through and the contract's results are rejected until the function exists again under the same name (a restore creates it right after) or the contract is redefined.",
        &ALLOW_CHECKER_DROP,
        pgrx::guc::GucContext::Userset,
        pgrx::guc::GucFlags::default(),
    );
}

pub fn undefined(name: &str) -> Refusal {
    Refusal::bad_input(format!("contract \"{name}\" is not defined"))
        .detail(format!("No row in intent.contracts has name \"{name}\"."))
        .hint("Define it first with intent.define_contract(name, output_schema, checker).")
}

/// The current version of a contract, or the `22023` refusal for an undefined one.
pub fn current_version(client: &mut SpiClient<'_>, name: &str) -> Answer<i32> {
    let row = plans::first(plans::run(client, contract_statement(), &[name.into()]))
        .ok_or_else(|| undefined(name))?;
    Ok(plans::must(&row, 1))
}

/// Refuses (IJ005) a failover to `provider` unless it holds a current certification for the
/// job's contract: not revoked, not expired, earned on the contract's current version.
pub fn check_certified(
    client: &mut SpiClient<'_>,
    job: &crate::job::Job,
    provider: &str,
) -> Answer<()> {
    let refusal = |why: String| {
        Refusal::provider_not_certified(format!(
            "failover of job {} to provider \"{provider}\" is not allowed",
            job.id
        ))
        .detail(format!(
            "The job's provider is \"{}\"; {why}.",
            job.provider
        ))
    };
    let refuse = |why: String| {
        refusal(why).hint("Run the contract tests against the provider and record them with intent.certify_provider(), or begin the attempt on the job's own provider.")
    };
    let Some(contract) = &job.contract else {
        return Err(refusal(format!(
            "job {} names no contract, so no other provider can be trusted with it",
            job.id
        ))
        .hint("Begin the attempt on the job's own provider. Failover needs a job submitted with a contract (a new idempotency key)."));
    };
    let Some(row) = plans::first(plans::run(
        client,
        &CERTIFICATION,
        &[provider.into(), contract.as_str().into()],
    )) else {
        return Err(refuse(format!(
            "provider \"{provider}\" was never certified for contract \"{contract}\""
        )));
    };
    let certified_version: i32 = plans::must(&row, 1);
    let expired: bool = plans::must(&row, 2);
    let expires_at: String = plans::must(&row, 3);
    let revoked_at: Option<String> = plans::get(&row, 4);
    let revoked_reason: Option<String> = plans::get(&row, 5);
    let current_version: i32 = plans::must(&row, 6);
    if let Some(at) = revoked_at {
        return Err(refuse(format!(
            "its certification for contract \"{contract}\" was revoked at {at}: {}",
            revoked_reason.unwrap_or_default()
        )));
    }
    if expired {
        return Err(refuse(format!(
            "its certification for contract \"{contract}\" expired at {expires_at}"
        )));
    }
    if certified_version != current_version {
        return Err(refuse(format!(
            "it was certified for version {certified_version} of contract \"{contract}\", which is now at version {current_version}"
        )));
    }
    Ok(())
}

crate::entry::sql_function!(define_contract, define_contract);

/// `intent.define_contract(name, output_schema, checker)` → the contract's version.
///
/// SECURITY INVOKER, unlike the other calls: it reads who called it (the defining role must
/// have the rights of the checker's owner), then does its work as the function's owner.
fn define_contract(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    // SAFETY: reads the current user, which for this SECURITY INVOKER function is the caller.
    // Declared SECURITY DEFINER (the 0.1.0 catalog, before ALTER EXTENSION UPDATE), the current
    // user is the function's owner: the role the session acts as is the best there is.
    let caller = unsafe {
        let user = pg_sys::GetUserId();
        if user == crate::entry::function_owner(fcinfo) {
            pg_sys::GetOuterUserId()
        } else {
            user
        }
    };
    let version = crate::entry::as_function_owner(fcinfo, || {
        define(arg(fcinfo, 0), arg(fcinfo, 1), arg(fcinfo, 2), caller)
    })?;
    Ok(value(fcinfo, Some(version)))
}

fn define(
    name: Option<&str>,
    output_schema: Option<Jsonb>,
    checker: Option<pg_sys::Oid>,
    caller: pg_sys::Oid,
) -> Answer<i32> {
    let name = input::name("name", name)?;
    let schema = input::document("output_schema", output_schema)?;
    let value = schema.to_value().map_err(|e| {
        Refusal::bad_input("output_schema is not a valid JSON Schema (draft 2020-12)").detail(e)
    })?;
    if let Err(e) = crate::schema::check_valid(&value) {
        return Err(
            Refusal::bad_input("output_schema is not a valid JSON Schema (draft 2020-12)")
                .detail(e)
                .hint("Validate the schema against the draft 2020-12 meta-schema."),
        );
    }
    if let Err(e) = crate::schema::compile(&value) {
        return Err(
            Refusal::bad_input("output_schema is a JSON Schema pg_intent cannot validate with")
                .detail(e)
                .hint("Keep every $ref on a schema (put shared definitions in $defs), $id URIs absolute, and patterns free of back-references and look-around, so that validation stays bounded."),
        );
    }
    Spi::connect_mut(|client| {
        let (checker_owner, identity) = match checker {
            Some(oid) => {
                let (owner, identity) = check_checker(client, oid, caller)?;
                (Some(owner), Some(identity))
            }
            None => (None, None),
        };
        let inserted = plans::first(if crate::store::compat::records_definers() {
            plans::run(
                client,
                &UPSERT_CONTRACT,
                &[
                    name.into(),
                    schema.into(),
                    identity.into(),
                    checker_owner.into(),
                    caller.into(),
                ],
            )
        } else {
            plans::run(
                client,
                &crate::store::compat::UPSERT_CONTRACT_0_1,
                &[name.into(), schema.into(), checker.into()],
            )
        });
        match inserted {
            Some(row) => Ok(plans::must(&row, 1)),
            // Unchanged definition: keep the version, and the certifications earned on it.
            None => current_version(client, name),
        }
    })
}

/// Refuses (22023) a checker that is not a STABLE or IMMUTABLE `(jsonb) → boolean` function,
/// that its owner cannot execute (it runs as its owner), or that the calling role could not
/// execute itself (a contract must not lend anyone a function they may not run), or that is
/// temporary (a contract outlives the session). Returns the checker's owner and identity.
fn check_checker(
    client: &mut SpiClient<'_>,
    oid: pg_sys::Oid,
    caller: pg_sys::Oid,
) -> Answer<(pg_sys::Oid, String)> {
    let Some(c) = crate::checker::describe(oid) else {
        return Err(Refusal::bad_input(format!(
            "checker function {oid} does not exist"
        )));
    };
    let signature = &c.signature;
    if !c.fits {
        return Err(Refusal::bad_input(format!(
            "checker {signature} must take (jsonb) and return boolean"
        ))
        .hint("Declare it as CREATE FUNCTION ...(result jsonb) RETURNS boolean."));
    }
    if !c.stable {
        return Err(
            Refusal::bad_input(format!("checker {signature} must be STABLE or IMMUTABLE"))
                .detail("A checker only judges a result; a volatile function could write.")
                .hint("Declare it STABLE (or IMMUTABLE)."),
        );
    }
    if !c.temp_last {
        return Err(Refusal::bad_input(format!(
            "checker {signature} sets a search_path that does not end with pg_temp"
        ))
        .detail("A search_path that does not name pg_temp has the completing session's temporary tables found first: a caller could stand in for the checker's own tables.")
        .hint(format!(
            "ALTER FUNCTION {signature} SET search_path = <its schemas>, pg_temp (or qualify every name it uses and drop the setting)."
        )));
    }
    if !crate::checker::may_execute(c.owner, oid) {
        return Err(Refusal::bad_input(format!(
            "checker {signature} cannot be executed by its owner"
        ))
        .detail("A checker runs as the role that owns it.")
        .hint(format!(
            "GRANT EXECUTE ON FUNCTION {signature} to its owner."
        )));
    }
    let row = plans::first(plans::run(
        client,
        &CALLER_MAY_USE,
        &[oid.into(), caller.into()],
    ))
    .expect("the function was just described");
    if !plans::must::<bool>(&row, 1) {
        return Err(Refusal::insufficient_privilege(format!(
            "permission denied to use {signature} as a checker"
        ))
        .detail("The role defining the contract may not execute the checker.")
        .hint(format!(
            "GRANT EXECUTE ON FUNCTION {signature} to the role that defines the contract."
        )));
    }
    if !plans::must::<bool>(&row, 2) {
        let owner: String = plans::must(&row, 3);
        return Err(Refusal::insufficient_privilege(format!(
            "permission denied to use {signature} as a checker"
        ))
        .detail(format!(
            "A checker runs as its owner, {owner}, and the role defining the contract does not have {owner}'s rights."
        ))
        .hint("Define the contract as a member of the checker's owner, or use a checker owned by the defining role."));
    }
    if plans::must::<bool>(&row, 5) {
        return Err(
            Refusal::bad_input(format!("checker {signature} is a temporary function"))
                .detail("A contract outlives the session; its temporary functions do not.")
                .hint("Create the checker in a permanent schema."),
        );
    }
    Ok((c.owner, plans::must(&row, 4)))
}

crate::entry::sql_function!(certify_provider, certify_provider);

/// `intent.certify_provider(provider, contract, evidence, valid_for)` → when it expires.
fn certify_provider(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let expires_at = certify(
        arg(fcinfo, 0),
        arg(fcinfo, 1),
        arg(fcinfo, 2),
        arg(fcinfo, 3),
    )?;
    Ok(value(fcinfo, Some(expires_at)))
}

fn certify(
    provider: Option<&str>,
    contract: Option<&str>,
    evidence: Option<Jsonb>,
    valid_for: Option<Interval>,
) -> Answer<TimestampWithTimeZone> {
    let provider = input::name("provider", provider)?;
    let contract = input::name("contract", contract)?;
    let evidence = input::document("evidence", evidence)?;
    let valid_for = input::required("valid_for", valid_for)?;
    if !input::within_ten_thousand_years(&valid_for) {
        return Err(
            Refusal::bad_input("valid_for must be positive and at most 366 days")
                .detail(format!("valid_for is {valid_for}."))
                .hint("Certify again with fresh evidence when it expires."),
        );
    }
    Spi::connect_mut(|client| {
        // Months have no fixed length: compare the real expiry, as the row will store it.
        let row = plans::first(plans::run(client, &VALIDITY_OK, &[valid_for.into()]))
            .expect("SELECT returns a row");
        if !plans::must::<bool>(&row, 1) {
            return Err(
                Refusal::bad_input("valid_for must be positive and at most 366 days")
                    .detail(format!("valid_for is {valid_for}."))
                    .hint("Certify again with fresh evidence when it expires."),
            );
        }
        let version = current_version(client, contract)?;
        let row = plans::first(plans::run(
            client,
            &CERTIFY,
            &[
                provider.into(),
                contract.into(),
                version.into(),
                evidence.into(),
                valid_for.into(),
            ],
        ))
        .expect("INSERT … RETURNING returns the row");
        Ok(plans::must(&row, 1))
    })
}

crate::entry::sql_function!(revoke_certification, revoke_certification);

/// `intent.revoke_certification(provider, contract, reason)` → boolean.
fn revoke_certification(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let revoked = revoke(arg(fcinfo, 0), arg(fcinfo, 1), arg(fcinfo, 2))?;
    Ok(value(fcinfo, Some(revoked)))
}

fn revoke(provider: Option<&str>, contract: Option<&str>, reason: Option<&str>) -> Answer<bool> {
    let provider = input::name("provider", provider)?;
    let contract = input::name("contract", contract)?;
    let reason = input::reason(reason, true)?;
    Spi::connect_mut(|client| {
        current_version(client, contract)?;
        let revoked = plans::run(
            client,
            &REVOKE,
            &[provider.into(), contract.into(), reason.into()],
        );
        Ok(!revoked.is_empty())
    })
}

crate::entry::sql_function!(validate_result, validate_result_entry);

/// `intent.validate_result(contract, result)` → `(valid, errors)`.
fn validate_result_entry(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let (valid, errors) = validate_result(arg(fcinfo, 0), arg(fcinfo, 1))?;
    Ok(one_row(fcinfo, |_| {
        vec![valid.into_datum(), pgrx::JsonB(errors).into_datum()]
    }))
}

fn validate_result(contract: Option<&str>, result: Option<Jsonb>) -> Answer<(bool, Value)> {
    let contract = input::name("contract", contract)?;
    let result = input::result(result)?;
    Spi::connect_mut(|client| match validate(client, contract, result) {
        None => Err(undefined(contract)),
        Some(Ok(())) => Ok((true, json!([]))),
        Some(Err(v)) => Ok((false, Value::Array(v.errors))),
    })
}

/// `intent._before_distributed_read()`: nothing but what every call does first. The drop guard
/// (a PL/pgSQL event trigger, SECURITY DEFINER) calls it before it reads `intent.contracts`,
/// which Citus may read over a connection of `intent_owner`'s (`citus_guard.rs`).
fn before_distributed_read(_fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    Ok(crate::entry::void())
}

crate::entry::sql_function!(
    before_distributed_read,
    before_distributed_read,
    "intent._before_distributed_read"
);

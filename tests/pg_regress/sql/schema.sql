-- schema: what a DBA reads directly. The tables and states of docs/reference.md (§ 2, § 4), a COMMENT on every
-- table and column, the rules that hold even for hand-written SQL (one job per intent, derived
-- ids, at most one open attempt per job), and nothing granted to PUBLIC.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- 1. The state types, in the order of docs/reference.md § 4.
SELECT t.typname, array_agg(e.enumlabel ORDER BY e.enumsortorder) AS labels
  FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
 WHERE t.typnamespace = 'intent'::regnamespace GROUP BY t.typname ORDER BY t.typname;

-- 2. The columns of the three tables, with their types.
SELECT c.relname AS "table", a.attname AS "column", format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull AS not_null
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
 WHERE c.relnamespace = 'intent'::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY c.relname, a.attnum;

-- 3. Every table, column, type and function of docs/reference.md carries a COMMENT: this query lists
--    the ones that do not, and must return no row.
SELECT c.relname, a.attname
  FROM pg_class c LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relnamespace = 'intent'::regnamespace AND c.relkind = 'r'
   AND (obj_description(c.oid, 'pg_class') IS NULL OR col_description(c.oid, a.attnum) IS NULL);
SELECT p.oid::regprocedure AS function_without_comment
  FROM pg_proc p WHERE p.pronamespace = 'intent'::regnamespace AND obj_description(p.oid, 'pg_proc') IS NULL;
SELECT t.typname AS type_without_comment
  FROM pg_type t WHERE t.typnamespace = 'intent'::regnamespace AND t.typtype = 'e'
   AND obj_description(t.oid, 'pg_type') IS NULL;

-- 4. The keys and the gate, as constraints and indexes.
SELECT conrelid::regclass AS "table", conname, pg_get_constraintdef(oid) AS definition
  FROM pg_constraint
 WHERE connamespace = 'intent'::regnamespace AND contype IN ('p', 'u', 'f')
 ORDER BY 1::text, 2;
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) AS definition
  FROM pg_index WHERE indrelid = 'intent.attempts'::regclass AND NOT indisprimary
 ORDER BY 1::text;

-- 5. Hand-written SQL cannot break the rules. (VERBOSITY terse: the DETAIL of a check
--    violation prints the failing row, timestamps included.) One job per intent: a second row
--    for the same (owner_id, idempotency_key) is a unique violation (23505); the primary key
--    catches it first, because the id is derived from that very pair.
SELECT job_id FROM intent.submit_job('ivy', 'k', 'p', '{}');
\set VERBOSITY terse
INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, retry_at)
VALUES (intent.job_id('ivy', 'k'), 'ivy', 'k', 'p', '{"other": true}', now());
\echo SQLSTATE :SQLSTATE
-- An id that is not the derived one is a check violation (23514), for jobs and attempts.
INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, retry_at)
VALUES (gen_random_uuid(), 'ivy', 'k2', 'p', '{}', now());
\echo SQLSTATE :SQLSTATE
INSERT INTO intent.attempts (id, job_id, owner_id, attempt_no, provider, version_read, lease, deadline)
VALUES (intent.attempt_id(intent.job_id('ivy', 'k'), 2), intent.job_id('ivy', 'k'), 'ivy', 1, 'p', 1, '1 hour', now() + '1 hour');
\echo SQLSTATE :SQLSTATE
-- The gate: while attempt 1 is open, a hand-written second open attempt is refused by the
-- partial unique index attempts_one_open_per_job (23505).
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('ivy', 'k'), NULL, '1 hour');
INSERT INTO intent.attempts (id, job_id, owner_id, attempt_no, provider, version_read, lease, deadline)
VALUES (intent.attempt_id(intent.job_id('ivy', 'k'), 2), intent.job_id('ivy', 'k'), 'ivy', 2, 'p', 1, '1 hour', now() + '1 hour');
\echo SQLSTATE :SQLSTATE
-- An unknown attempt is open too.
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('ivy', 'k'), 1));
INSERT INTO intent.attempts (id, job_id, owner_id, attempt_no, provider, state, version_read, lease, deadline)
VALUES (intent.attempt_id(intent.job_id('ivy', 'k'), 2), intent.job_id('ivy', 'k'), 'ivy', 2, 'p', 'unknown', 1, '1 hour', now() + '1 hour');
\echo SQLSTATE :SQLSTATE
-- An event cannot name an attempt of another job (23514).
INSERT INTO intent.events (job_id, owner_id, attempt_id, kind)
VALUES (intent.job_id('ivy', 'k'), 'ivy', intent.attempt_id(intent.job_id('ivy', 'other'), 1), 'timeout');
\echo SQLSTATE :SQLSTATE
-- Nor be of a kind the protocol does not know (23514).
INSERT INTO intent.events (job_id, owner_id, kind) VALUES (intent.job_id('ivy', 'k'), 'ivy', 'retried');
\echo SQLSTATE :SQLSTATE
-- A job names a defined contract (foreign key, 23503), and a contract that a job names cannot
-- be deleted (23503). image-v1 is defined in setup.
INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, contract, retry_at)
VALUES (intent.job_id('ivy', 'k3'), 'ivy', 'k3', 'p', '{}', 'no-such-contract', now());
\echo SQLSTATE :SQLSTATE
SELECT job_id FROM intent.submit_job('ivy', 'contracted', 'p', '{}', 'image-v1');
DELETE FROM intent.contracts WHERE name = 'image-v1';
\echo SQLSTATE :SQLSTATE
-- A certification names a defined contract (23503), expires after it was recorded, and is
-- revoked with a reason or not at all (23514).
INSERT INTO intent.certifications (provider, contract, contract_version, evidence, expires_at)
VALUES ('p', 'no-such-contract', 1, '{}', now() + '1 day');
\echo SQLSTATE :SQLSTATE
INSERT INTO intent.certifications (provider, contract, contract_version, evidence, expires_at)
VALUES ('p', 'image-v1', 1, '{}', now() - '1 second'::interval);
\echo SQLSTATE :SQLSTATE
INSERT INTO intent.certifications (provider, contract, contract_version, evidence, expires_at, revoked_at)
VALUES ('p', 'image-v1', 1, '{}', now() + '1 day', now());
\echo SQLSTATE :SQLSTATE
\set VERBOSITY default
SELECT count(*) AS jobs FROM intent.jobs;
SELECT count(*) AS attempts FROM intent.attempts;
SELECT count(*) AS events FROM intent.events;

-- 6. Secure by default: PUBLIC may use nothing in schema intent (no table, no sequence, no
--    function), so an application role gets exactly the calls it is granted.
SET client_min_messages = warning;
DROP ROLE IF EXISTS intent_regress_app;
RESET client_min_messages;
CREATE ROLE intent_regress_app LOGIN;
SET ROLE intent_regress_app;
SELECT count(*) FROM intent.jobs;
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.submit_job('app', 'k', 'p', '{}');
\echo SQLSTATE :SQLSTATE
RESET ROLE;
SELECT c.relname, has_table_privilege('intent_regress_app', c.oid, 'SELECT') AS can_select
  FROM pg_class c WHERE c.relnamespace = 'intent'::regnamespace AND c.relkind IN ('r', 'S') ORDER BY 1;
SELECT count(*) AS functions, count(*) FILTER (WHERE has_function_privilege('intent_regress_app', p.oid, 'EXECUTE')) AS executable
  FROM pg_proc p WHERE p.pronamespace = 'intent'::regnamespace;
-- The functions, one per row: the API (SECURITY DEFINER, with a pinned search_path), the
-- immutable id derivations, owner_admits (the distributed mode's policies: plain SQL, every
-- name qualified, not pinned so that the planner inlines it), distribute() (its own settings),
-- and the internal cores (a leading underscore) that only the API calls.
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer,
       p.proconfig IS NOT NULL AS pinned_search_path, p.provolatile AS volatility
  FROM pg_proc p WHERE p.pronamespace = 'intent'::regnamespace
 ORDER BY p.proname LIKE '\_%', p.proname COLLATE "C";
-- Granting one call is enough to use it: the functions are SECURITY DEFINER.
GRANT USAGE ON SCHEMA intent TO intent_regress_app;
GRANT EXECUTE ON FUNCTION intent.submit_job(text, text, text, jsonb, text, integer) TO intent_regress_app;
SET ROLE intent_regress_app;
SELECT job_id, created FROM intent.submit_job('app', 'k', 'p', '{}');
SELECT count(*) FROM intent.jobs;
\echo SQLSTATE :SQLSTATE
RESET ROLE;
REVOKE ALL ON FUNCTION intent.submit_job(text, text, text, jsonb, text, integer) FROM intent_regress_app;
REVOKE ALL ON SCHEMA intent FROM intent_regress_app;
DROP ROLE intent_regress_app;

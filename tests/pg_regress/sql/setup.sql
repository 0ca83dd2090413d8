-- setup: installs pg_intent into the fresh test database and defines the helpers that the
-- other tests use to read the tables without printing anything that changes from run to run
-- (timestamps, event ids). Ids are derived from the intent, so they are printed as they are:
-- the expected files prove the derivation as well.
--
-- Every test file starts with the same preamble, sql/preamble.sql (pg_regress names its input
-- directory in PG_ABS_SRCDIR): no PL/pgSQL CONTEXT lines, fixed date and interval styles
-- (pg_regress sets PGDATESTYLE and PGTZ for its sessions), and the extension (without the
-- NOTICE that it exists already, which psql would prefix with the preamble's absolute path).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql

-- The extension lives in schema intent and cannot be moved.
SELECT e.extname, n.nspname AS schema, e.extrelocatable
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'pg_intent';

-- Helpers live in schema t (for "test"), apart from the extension's own objects.
CREATE SCHEMA t;
-- Contract checkers defined in t run as intent_owner, which needs to reach them.
GRANT USAGE ON SCHEMA t TO intent_owner;

-- t.mask(text): replaces timestamps (ISO, jsonb's ISO with a T, and the Postgres datestyle)
-- by <timestamp>, so a DETAIL or an event that names a deadline still prints the same words.
CREATE FUNCTION t.mask(s text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT regexp_replace(
           regexp_replace(s,
             '\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:?\d\d)?)?', '<timestamp>', 'g'),
           '[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(\.\d+)? \d{4}( [A-Z]+)?', '<timestamp>', 'g')
$$;

-- t.error_of(sql): runs one statement and shows the error it raised, one field per row:
-- SQLSTATE, MESSAGE, DETAIL and HINT, timestamps masked. Used for the refusals whose DETAIL
-- names a deadline (IJ002, IJ003). A statement that does not fail shows SQLSTATE 00000, so a
-- missing refusal cannot go unnoticed. The statement runs in a subtransaction that the error
-- rolls back, exactly as a failed statement of the caller would be.
CREATE FUNCTION t.error_of(stmt text) RETURNS TABLE (field text, value text)
LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text; hnt text;
BEGIN
    BEGIN
        EXECUTE stmt;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                                det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
        field := 'SQLSTATE'; value := st;             RETURN NEXT;
        field := 'MESSAGE';  value := t.mask(msg);    RETURN NEXT;
        field := 'DETAIL';   value := t.mask(nullif(det, '')); RETURN NEXT;
        field := 'HINT';     value := t.mask(nullif(hnt, '')); RETURN NEXT;
        RETURN;
    END;
    field := 'SQLSTATE'; value := '00000 (no error)'; RETURN NEXT;
END
$$;

-- t.digest(): one md5 over every row of the five tables (jobs, attempts, events, contracts,
-- certifications), including each row's xmin and ctid, so that any write (even an UPDATE that
-- sets a column to its old value) changes it.
CREATE FUNCTION t.digest() RETURNS text
LANGUAGE sql AS $$
  SELECT md5(
      coalesce((SELECT string_agg(j::text || j.xmin::text || j.ctid::text, ',' ORDER BY j.id) FROM intent.jobs j), '')
   || '|' ||
      coalesce((SELECT string_agg(a::text || a.xmin::text || a.ctid::text, ',' ORDER BY a.id) FROM intent.attempts a), '')
   || '|' ||
      coalesce((SELECT string_agg(e::text || e.xmin::text || e.ctid::text, ',' ORDER BY e.id) FROM intent.events e), '')
   || '|' ||
      coalesce((SELECT string_agg(c::text || c.xmin::text || c.ctid::text, ',' ORDER BY c.name) FROM intent.contracts c), '')
   || '|' ||
      coalesce((SELECT string_agg(r::text || r.xmin::text || r.ctid::text, ',' ORDER BY r.id) FROM intent.certifications r), ''))
$$;

-- t.snapshot(): remembers the digest (in a session setting) and shows the row counts of the
-- three job tables. t.unchanged(): the row counts again, and whether anything at all was
-- written since, in any of the five tables.
CREATE FUNCTION t.snapshot() RETURNS TABLE (jobs bigint, attempts bigint, events bigint)
LANGUAGE sql AS $$
  SELECT set_config('t.digest', t.digest(), false);
  SELECT (SELECT count(*) FROM intent.jobs), (SELECT count(*) FROM intent.attempts),
         (SELECT count(*) FROM intent.events)
$$;
CREATE FUNCTION t.unchanged() RETURNS TABLE (jobs bigint, attempts bigint, events bigint, unchanged boolean)
LANGUAGE sql AS $$
  SELECT (SELECT count(*) FROM intent.jobs), (SELECT count(*) FROM intent.attempts),
         (SELECT count(*) FROM intent.events), t.digest() = current_setting('t.digest', true)
$$;

-- t.no(id): the attempt number carried in an id's last two bytes (0 for a job id).
CREATE FUNCTION t.no(id uuid) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
  SELECT ('x' || right(replace(id::text, '-', ''), 4))::bit(16)::integer
$$;

-- t.job(id): the job row without its timestamps; completed_by as the attempt number.
-- (t.job, t.attempts and t.events are PL/pgSQL, casting each column to the declared type: on
-- the citus target the tables are distributed, and Citus cannot plan a SQL function's
-- parameter in a query on a distributed table.)
CREATE FUNCTION t.job(id uuid)
RETURNS TABLE (state intent.job_state, version bigint, completed_by integer, attempt_count integer,
               max_attempts integer, result jsonb, error jsonb)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
  SELECT j.state, j.version::bigint, t.no(j.completed_by), j.attempt_count::integer,
         j.max_attempts::integer, j.result, j.error
    FROM intent.jobs j WHERE j.id = $1;
END
$$;

-- t.attempts(job): the attempts of a job in order, without timestamps; "finished" says
-- whether finished_at is set.
CREATE FUNCTION t.attempts(job uuid)
RETURNS TABLE (no integer, provider text, state intent.attempt_state, version_read bigint,
               worker text, finished boolean, result jsonb, error jsonb)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
  SELECT a.attempt_no::integer, a.provider::text, a.state, a.version_read::bigint, a.worker::text,
         a.finished_at IS NOT NULL, a.result, a.error
    FROM intent.attempts a WHERE a.job_id = $1 ORDER BY a.attempt_no;
END
$$;

-- t.events(job): the log of a job in order; the attempt as its number, timestamps masked.
CREATE FUNCTION t.events(job uuid)
RETURNS TABLE (kind text, attempt integer, detail text)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
  SELECT e.kind::text, t.no(e.attempt_id), t.mask(e.detail::text)
    FROM intent.events e WHERE e.job_id = $1 ORDER BY e.id;
END
$$;

-- The helpers work: a masked DETAIL, a statement that does not fail, a digest that notices.
SELECT t.mask('runs until 2026-11-30 03:43:02.989108+00, jsonb "2026-11-30T03:43:02.989108+00:00", pg Sun Nov 29 19:43:02.98 2026 PST.');
SELECT * FROM t.error_of('SELECT 1/0');
SELECT * FROM t.error_of('SELECT 1');
SELECT t.no('62ccd04c-f6e5-82dd-aeee-a9dac8090001'), t.no('62ccd04c-f6e5-82dd-aeee-a9dac809ffff'),
       t.no('62ccd04c-f6e5-82dd-aeee-a9dac8090000');
SELECT * FROM t.snapshot();
SELECT * FROM t.unchanged();
-- A write to intent.events must make unchanged false (then undone).
BEGIN;
INSERT INTO intent.events (job_id, owner_id, kind) VALUES (intent.job_id('o', 'k'), 'o', 'cancelled');
SELECT * FROM t.unchanged();
ROLLBACK;
SELECT * FROM t.unchanged();
-- A write to intent.contracts is noticed too (then undone).
BEGIN;
SELECT intent.define_contract('setup-probe', '{}');
SELECT unchanged FROM t.unchanged();
ROLLBACK;
SELECT unchanged FROM t.unchanged();

-- The contracts that the other tests name: intent.jobs.contract must name a defined contract
-- (submit_job refuses an undefined one with 22023). image-v1 and image-v2 (submit),
-- frames-v1 (begin) and a name of 255 multibyte characters (bad_input). Any JSON object
-- satisfies them; the contracts test covers what a contract checks. Each is at version 1.
SELECT CASE WHEN name = repeat('ç', 255) THEN '255 × ç' ELSE name END AS name,
       intent.define_contract(name, '{"type": "object"}') AS version
  FROM unnest(ARRAY['image-v1', 'image-v2', 'frames-v1', repeat('ç', 255)]) WITH ORDINALITY AS c(name, n)
 ORDER BY n;

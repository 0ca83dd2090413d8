-- contracts: docs/protocol.md § Contracts and failover. A contract says what a job's result must satisfy: a
-- JSON Schema (draft 2020-12) for its shape and, optionally, a checker function (jsonb) ->
-- boolean for what business logic must be able to interpret. Every result of a job with a
-- contract is validated (schema, then checker) before it can win; a result that breaks it is
-- `rejected`. A failover (an attempt on a provider other than the job's own) needs the job to
-- name a contract and the provider to hold a current certification for it: recorded evidence,
-- with an expiry, not revoked, earned on the contract's current version; otherwise IJ005.
--
-- The story: the studio renders frames on gpu-a; gpu-b is the fallback. Contract "render"
-- says what a render result looks like. Timestamps in DETAILs are masked (t.error_of).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- Helpers for this file.
-- t.contract(name): the contract row, without timestamps; "redefined" says whether it
-- changed since it was first defined.
CREATE FUNCTION t.contract(name text)
RETURNS TABLE (version integer, checker text, redefined boolean, output_schema jsonb)
LANGUAGE sql AS $$
  SELECT c.version, c.checker, c.updated_at <> c.created_at, c.output_schema
    FROM intent.contracts c WHERE c.name = $1
$$;
-- t.certifications(provider): a provider's certifications, oldest first, without timestamps.
CREATE FUNCTION t.certifications(provider text)
RETURNS TABLE (contract text, contract_version integer, evidence jsonb, valid_for interval,
               revoked boolean, revoked_reason text)
LANGUAGE sql AS $$
  SELECT c.contract, c.contract_version, c.evidence, c.expires_at - c.certified_at,
         c.revoked_at IS NOT NULL, c.revoked_reason
    FROM intent.certifications c WHERE c.provider = $1 ORDER BY c.id
$$;
-- t.refused(calls): each call with the SQLSTATE, message and DETAIL it raised.
CREATE FUNCTION t.refused(calls text[])
RETURNS TABLE (call text, sqlstate text, message text, detail text)
LANGUAGE sql AS $$
  SELECT c.call, e.sqlstate, e.message, e.detail
    FROM unnest(calls) WITH ORDINALITY AS c(call, n),
         LATERAL (SELECT max(value) FILTER (WHERE field = 'SQLSTATE') AS sqlstate,
                         max(value) FILTER (WHERE field = 'MESSAGE') AS message,
                         max(value) FILTER (WHERE field = 'DETAIL') AS detail
                    FROM t.error_of(c.call)) AS e
   ORDER BY c.n
$$;

-- The business rule behind contract "render": a frame must be stored in the renders bucket.
-- A debug render cannot be interpreted at all, and the checker says so by raising an error.
CREATE FUNCTION t.render_ok(result jsonb) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF result ? 'debug' THEN
        RAISE EXCEPTION 'cannot interpret a debug render (%)', result->>'debug';
    END IF;
    RETURN result->>'url' LIKE 's3://renders/%';
END
$$;
-- Functions that cannot be checkers: a volatile one (it could write), one that takes text,
-- one that returns a number.
CREATE FUNCTION t.render_ok_volatile(result jsonb) RETURNS boolean
LANGUAGE sql VOLATILE AS $$ SELECT true $$;
CREATE FUNCTION t.render_ok_text(result text) RETURNS boolean
LANGUAGE sql STABLE AS $$ SELECT true $$;
CREATE FUNCTION t.frame_count(result jsonb) RETURNS integer
LANGUAGE sql STABLE AS $$ SELECT (result->>'frames')::integer $$;

-- 1. define_contract: the first definition is version 1.
SELECT intent.define_contract('render', '{"type": "object", "required": ["url"],
                                          "properties": {"url": {"type": "string"}}}');
SELECT * FROM t.contract('render');
-- The same definition again (key order and whitespace do not matter: jsonb equality) keeps
-- the version, and writes nothing: certifications earned on it keep counting.
SELECT * FROM t.snapshot();
SELECT intent.define_contract('render', '{"properties": {"url": {"type": "string"}},
                                          "required": ["url"], "type": "object"}');
SELECT * FROM t.unchanged();
-- A changed schema bumps the version: frames must now be a positive integer, and tags, when
-- present, an array of strings.
SELECT intent.define_contract('render', '{"type": "object", "required": ["url", "frames"],
  "properties": {"url": {"type": "string"}, "frames": {"type": "integer", "minimum": 1},
                 "tags": {"type": "array", "items": {"type": "string"}}}}');
SELECT version, checker, redefined FROM t.contract('render');
-- So does adding a checker (version 3); the same schema and checker again keep version 3.
SELECT intent.define_contract(name, output_schema, 't.render_ok(jsonb)')
  FROM intent.contracts WHERE name = 'render';
SELECT intent.define_contract(name, output_schema, 't.render_ok(jsonb)')
  FROM intent.contracts WHERE name = 'render';
SELECT version, checker, redefined FROM t.contract('render');

-- 2. define_contract refuses (22023) what cannot be a contract, and writes nothing: a schema
--    that is not a valid draft 2020-12 JSON Schema (an unknown type, a minimum that is not a
--    number, an array instead of an object, a $ref to nowhere, a $ref to a remote document:
--    nothing is ever fetched), and a checker that is VOLATILE, takes anything but (jsonb) or
--    returns anything but boolean. A refused redefinition leaves the contract as it was.
SELECT * FROM t.snapshot();
SELECT * FROM t.refused(ARRAY[
  $$SELECT intent.define_contract('render', '{"type": "picture"}')$$,
  $$SELECT intent.define_contract('render', '{"type": "object", "properties": {"frames": {"minimum": "one"}}}')$$,
  $$SELECT intent.define_contract('render-v2', '[{"type": "object"}]')$$,
  $$SELECT intent.define_contract('render-v2', '{"$ref": "#/$defs/frame"}')$$,
  $$SELECT intent.define_contract('render-v2', '{"$ref": "https://example.com/render.schema.json"}')$$,
  $$SELECT intent.define_contract('render', '{}', 't.render_ok_volatile(jsonb)')$$,
  $$SELECT intent.define_contract('render', '{}', 't.render_ok_text(text)')$$,
  $$SELECT intent.define_contract('render', '{}', 't.frame_count(jsonb)')$$
]);
-- (The HINTs say what to do.)
SELECT field, value FROM t.error_of($$SELECT intent.define_contract('render', '{}', 't.render_ok_volatile(jsonb)')$$)
 WHERE field IN ('DETAIL', 'HINT');
SELECT * FROM t.unchanged();
SELECT version, checker FROM t.contract('render');

-- 3. validate_result checks a result without writing anything (for the contract-test harness
--    and for DBAs): valid, and the errors. A valid result:
SELECT * FROM t.snapshot();
SELECT * FROM intent.validate_result('render', '{"url": "s3://renders/f1.png", "frames": 1, "tags": ["cat"]}');
-- Schema errors name the JSON pointer of the offending value ("" is the document itself);
-- all of them are reported, not just the first.
SELECT * FROM intent.validate_result('render', '{"url": 5, "frames": 0, "tags": ["cat", 7]}');
SELECT * FROM intent.validate_result('render', '{}');
SELECT * FROM intent.validate_result('render', '["s3://renders/f1.png"]');
-- The checker runs only on a result of the right shape: it returned false (wrong bucket) ...
SELECT * FROM intent.validate_result('render', '{"url": "s3://scratch/f1.png", "frames": 1}');
-- ... or raised an error, which rejects the result and is reported with its SQLSTATE and text.
SELECT * FROM intent.validate_result('render', '{"url": "s3://renders/f1.png", "frames": 1, "debug": "wireframe"}');
-- A result that breaks the schema is not shown to the checker (it would raise here).
SELECT * FROM intent.validate_result('render', '{"frames": 1, "debug": "wireframe"}');
-- An undefined contract is 22023; contract names are compared exactly.
SELECT * FROM t.error_of($$SELECT intent.validate_result('Render', '{}')$$);
SELECT * FROM t.unchanged();

-- 4. Failover needs a certification. The studio's jobs run on gpu-a under contract render.
--    gpu-b was never certified for it: IJ005, and the DETAIL says so. Nothing is written.
SELECT k, (SELECT created FROM intent.submit_job('studio', k, 'gpu-a', '{"scene": 1}', 'render', 3)) AS created
  FROM unnest(ARRAY['never', 'allowed', 'revoked', 'inflight-valid', 'inflight-invalid', 'expired', 'outdated']) AS k;
SELECT * FROM t.snapshot();
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('studio', 'never'), 'gpu-b')$$);
SELECT * FROM t.unchanged();

-- 5. certify_provider records the evidence (the contract-test results) on the contract's
--    current version (3) and returns when it expires: by default in 30 days.
SELECT intent.certify_provider('gpu-b', 'render', '{"suite": "render-contract", "cases": 40, "passed": 40}')
       - statement_timestamp() AS valid_for;
SELECT * FROM t.certifications('gpu-b');
-- Now the failover is allowed: attempt 1 of studio/allowed runs on gpu-b, and its valid
-- result wins like any other.
SELECT attempt_no, version FROM intent.begin_attempt(intent.job_id('studio', 'allowed'), 'gpu-b', '1 hour');
SELECT no, provider, state FROM t.attempts(intent.job_id('studio', 'allowed'));
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'allowed'), 1), 1,
                               '{"url": "s3://renders/allowed.png", "frames": 24}');
SELECT state, version, completed_by, result FROM t.job(intent.job_id('studio', 'allowed'));

-- 6. revoke_certification withdraws it: true when a current certification was revoked.
--    Before that, two attempts begin on gpu-b while it is still certified.
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('studio', 'inflight-valid'), 'gpu-b', '1 hour');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('studio', 'inflight-invalid'), 'gpu-b', '1 hour');
SELECT intent.revoke_certification('gpu-b', 'render', 'contract tests fail since the model update');
SELECT revoked, revoked_reason FROM t.certifications('gpu-b');
-- Nothing current is left to revoke: false, and nothing written.
SELECT * FROM t.snapshot();
SELECT intent.revoke_certification('gpu-b', 'render', 'again');
SELECT intent.revoke_certification('gpu-never-certified', 'render', 'just in case');
SELECT * FROM t.unchanged();
-- New failovers to gpu-b are refused: IJ005, the DETAIL says when and why it was revoked.
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('studio', 'revoked'), 'gpu-b')$$);
SELECT * FROM t.unchanged();
-- The job's own provider needs no certification.
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('studio', 'revoked'), 'gpu-a', '1 hour');

-- 7. Attempts that began on gpu-b before the revocation are not cut off: revocation only
--    stops new failovers, and every result is validated anyway. A valid result still wins;
--    an invalid one is rejected like anybody's.
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'inflight-valid'), 1), 1,
                               '{"url": "s3://renders/inflight.png", "frames": 12}');
SELECT state, completed_by, result FROM t.job(intent.job_id('studio', 'inflight-valid'));
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'inflight-invalid'), 1), 1,
                               '{"url": "s3://renders/inflight.png", "frames": "twelve"}');
SELECT state, version, completed_by, result FROM t.job(intent.job_id('studio', 'inflight-invalid'));
SELECT no, provider, state, error->>'kind' AS error_kind FROM t.attempts(intent.job_id('studio', 'inflight-invalid'));

-- 8. Expiry. A newer certification replaces the revoked one (the newest row for a provider
--    and contract is the one that counts), here valid for only 200 milliseconds. Once it has
--    run out, failover is refused again: IJ005, "expired" (not "revoked").
SELECT intent.certify_provider('gpu-b', 'render', '{"suite": "render-contract", "cases": 40, "passed": 40, "run": 2}',
                               '200 milliseconds') - statement_timestamp() AS valid_for;
SELECT pg_sleep(0.4);
SELECT * FROM t.snapshot();
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('studio', 'expired'), 'gpu-b')$$);
SELECT * FROM t.unchanged();
-- Revoking an expired certification finds nothing current: false.
SELECT intent.revoke_certification('gpu-b', 'render', 'expired anyway');

-- 9. A redefined contract needs new evidence. gpu-b is certified again (version 3, allowed),
--    then render changes (tags are now required): version 4, and the certification earned on
--    version 3 no longer counts: IJ005, the DETAIL names both versions. Certifying gpu-b on
--    version 4 allows the failover again.
SELECT intent.certify_provider('gpu-b', 'render', '{"suite": "render-contract", "cases": 40, "passed": 40, "run": 3}')
       - statement_timestamp() AS valid_for;
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('studio', 'outdated'), 'gpu-b', '1 hour');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('studio', 'outdated'), 1), 'operator: retry after the contract change');
SELECT intent.define_contract('render', output_schema || '{"required": ["url", "frames", "tags"]}', checker::regprocedure)
  FROM intent.contracts WHERE name = 'render';
SELECT version, checker, output_schema->'required' AS required FROM t.contract('render');
SELECT * FROM t.snapshot();
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('studio', 'outdated'), 'gpu-b')$$);
SELECT * FROM t.unchanged();
SELECT intent.certify_provider('gpu-b', 'render', '{"suite": "render-contract", "cases": 41, "passed": 41, "run": 4}')
       - statement_timestamp() AS valid_for;
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('studio', 'outdated'), 'gpu-b', '1 hour');
-- The whole history of gpu-b stays in the table.
SELECT * FROM t.certifications('gpu-b');

-- 10. A job that names no contract cannot fail over at all, whatever certifications the
--     other provider holds; nor does a certification for another contract count.
SELECT job_id FROM intent.submit_job('studio', 'no-contract', 'gpu-a', '{"scene": 2}');
SELECT job_id FROM intent.submit_job('studio', 'other-contract', 'gpu-a', '{"scene": 3}', 'image-v1');
SELECT * FROM t.snapshot();
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('studio', 'no-contract'), 'gpu-b')$$);
SELECT field, value FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('studio', 'other-contract'), 'gpu-b')$$)
 WHERE field IN ('SQLSTATE', 'DETAIL');
SELECT * FROM t.unchanged();

-- 11. Results that break the contract are rejected, never win. studio/reject may make three
--     attempts (on gpu-a, its own provider). Attempt 1 returns a result that breaks the
--     schema: rejected. The job goes back to pending with its version unchanged and no
--     result; the attempt fails with error kind contract_violation (contract, version and the
--     errors) and keeps its result on its own row; a contract_violation event is logged.
SELECT job_id FROM intent.submit_job('studio', 'reject', 'gpu-a', '{"scene": 4}', 'render', 3);
SELECT attempt_no, version FROM intent.begin_attempt(intent.job_id('studio', 'reject'), NULL, '1 hour');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'reject'), 1), 1,
                               '{"url": "s3://renders/r1.png", "frames": 0, "tags": []}');
SELECT * FROM t.job(intent.job_id('studio', 'reject'));
SELECT no, state, finished, result, error FROM t.attempts(intent.job_id('studio', 'reject'));
SELECT * FROM t.events(intent.job_id('studio', 'reject'));
-- Asked again, with the same result or another (even a valid one): rejected, and nothing is
-- written or logged. A fail_attempt for it afterwards changes nothing either.
SELECT * FROM t.snapshot();
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'reject'), 1), 1,
                               '{"url": "s3://renders/r1.png", "frames": 0, "tags": []}');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'reject'), 1), 1,
                               '{"url": "s3://renders/r1.png", "frames": 1, "tags": []}');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('studio', 'reject'), 1), 1, '{"status": 500}');
SELECT * FROM t.unchanged();
-- Attempt 2 returns a well-formed result that the checker refuses (wrong bucket): rejected
-- as well, the checker's verdict recorded as the error.
SELECT attempt_no, version FROM intent.begin_attempt(intent.job_id('studio', 'reject'), NULL, '1 hour');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'reject'), 2), 1,
                               '{"url": "s3://scratch/r2.png", "frames": 1, "tags": []}');
SELECT state, version, completed_by, attempt_count, result FROM t.job(intent.job_id('studio', 'reject'));
SELECT no, state, result, error FROM t.attempts(intent.job_id('studio', 'reject')) WHERE no = 2;
-- Attempt 3, the last one allowed, returns a result the checker cannot interpret (it raises):
-- rejected, and with no attempts left the job fails, by the same compare-and-swap as a win
-- (version + 1, completed_by = attempt 3, the violation copied to the job's error).
SELECT attempt_no, version FROM intent.begin_attempt(intent.job_id('studio', 'reject'), NULL, '1 hour');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'reject'), 3), 1,
                               '{"url": "s3://renders/r3.png", "frames": 1, "tags": [], "debug": "wireframe"}');
SELECT * FROM t.job(intent.job_id('studio', 'reject'));
SELECT no, state, finished, error->'errors' AS errors FROM t.attempts(intent.job_id('studio', 'reject'));
SELECT kind, attempt, detail::jsonb->>'job_state' AS job_state, detail::jsonb->'errors' AS errors
  FROM t.events(intent.job_id('studio', 'reject'));
SELECT field, value FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('studio', 'reject'))$$)
 WHERE field = 'SQLSTATE';
-- A valid result on a job with a contract simply wins.
SELECT job_id FROM intent.submit_job('studio', 'valid', 'gpu-a', '{"scene": 5}', 'render');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('studio', 'valid'), NULL, '1 hour');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('studio', 'valid'), 1), 1,
                               '{"url": "s3://renders/v1.png", "frames": 1, "tags": ["final"]}');
SELECT state, version, completed_by, result FROM t.job(intent.job_id('studio', 'valid'));

-- 12. Bad input of the contract functions: 22023, and nothing is written. Names (contract,
--     provider) are 1-255 characters and not NULL; output_schema, evidence and result are
--     not NULL; a checker must exist; valid_for is positive and at most 366 days; reason is
--     1-1000 characters and required; a contract must be defined.
SELECT * FROM t.snapshot();
SELECT * FROM t.refused(ARRAY[
  $$SELECT intent.define_contract(NULL, '{}')$$,
  $$SELECT intent.define_contract('', '{}')$$,
  $$SELECT intent.define_contract(repeat('n', 256), '{}')$$,
  $$SELECT intent.define_contract('render-v2', NULL)$$,
  $$SELECT intent.define_contract('render-v2', '{}', '-')$$,
  $$SELECT intent.certify_provider(NULL, 'render', '{}')$$,
  $$SELECT intent.certify_provider('', 'render', '{}')$$,
  $$SELECT intent.certify_provider(repeat('p', 256), 'render', '{}')$$,
  $$SELECT intent.certify_provider('gpu-c', NULL, '{}')$$,
  $$SELECT intent.certify_provider('gpu-c', '', '{}')$$,
  $$SELECT intent.certify_provider('gpu-c', 'render-v2', '{}')$$,
  $$SELECT intent.certify_provider('gpu-c', 'render', NULL)$$,
  $$SELECT intent.certify_provider('gpu-c', 'render', '{}', NULL)$$,
  $$SELECT intent.certify_provider('gpu-c', 'render', '{}', '0 seconds')$$,
  $$SELECT intent.certify_provider('gpu-c', 'render', '{}', '-1 day')$$,
  $$SELECT intent.certify_provider('gpu-c', 'render', '{}', '366 days 00:00:00.000001')$$,
  $$SELECT intent.certify_provider('gpu-c', 'render', '{}', '400 days')$$,
  $$SELECT intent.revoke_certification(NULL, 'render', 'why')$$,
  $$SELECT intent.revoke_certification('', 'render', 'why')$$,
  $$SELECT intent.revoke_certification('gpu-b', NULL, 'why')$$,
  $$SELECT intent.revoke_certification('gpu-b', 'render-v2', 'why')$$,
  $$SELECT intent.revoke_certification('gpu-b', 'render', NULL)$$,
  $$SELECT intent.revoke_certification('gpu-b', 'render', '')$$,
  $$SELECT intent.revoke_certification('gpu-b', 'render', repeat('r', 1001))$$,
  $$SELECT intent.validate_result(NULL, '{}')$$,
  $$SELECT intent.validate_result('', '{}')$$,
  $$SELECT intent.validate_result(repeat('n', 256), '{}')$$,
  $$SELECT intent.validate_result('render', NULL)$$,
  $$SELECT intent.validate_result('render-v2', '{}')$$
]);
SELECT * FROM t.unchanged();
-- The limits themselves are accepted: a name of 255 characters, valid_for of 366 days and of
-- one microsecond.
SELECT intent.define_contract(repeat('ж', 255), '{}') AS version;
SELECT intent.certify_provider('gpu-c', 'render', '{}', '366 days') - statement_timestamp() AS max_valid_for,
       intent.certify_provider('gpu-c', 'render', '{}', '1 microsecond') - statement_timestamp() AS min_valid_for;
-- The certification that counts for each provider of render (the newest): the refused
-- revocations did not touch gpu-b's; gpu-c's newest is the microsecond one, already expired.
SELECT DISTINCT ON (provider) provider, contract_version, revoked_at IS NOT NULL AS revoked,
       expires_at > now() AS current
  FROM intent.certifications WHERE contract = 'render' ORDER BY provider, id DESC;

-- 13. The story in the log: one contract_violation per rejected result, and nothing for the
--     refusals, the certifications or the asking again.
SELECT j.idempotency_key, e.kind, t.no(e.attempt_id) AS attempt
  FROM intent.events e JOIN intent.jobs j ON j.id = e.job_id
 ORDER BY e.id;

-- 14. A checker cannot be dropped while a contract uses it (an event trigger refuses with
--     2BP01); once the contract is redefined without it, it can.
CREATE FUNCTION t.droppable_check(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
SELECT intent.define_contract('guarded', '{}', 't.droppable_check(jsonb)') AS version;
DROP FUNCTION t.droppable_check(jsonb);
\echo SQLSTATE :SQLSTATE
SELECT intent.define_contract('guarded', '{}') AS version;
DROP FUNCTION t.droppable_check(jsonb);
\echo SQLSTATE :SQLSTATE

-- 15. valid_for is measured on the calendar: 12 months and 6 days is more than 366 days.
SELECT intent.certify_provider('gpu-c', 'render', '{}', '12 months 6 days');
\echo SQLSTATE :SQLSTATE

-- 16. The compiled schema follows the committed definition, never a rolled-back one, even
--     when a later definition gets the same version number.
SELECT intent.define_contract('shape', '{"type": "object", "required": ["url"]}') AS version;
BEGIN;
SELECT intent.define_contract('shape', '{}') AS version_never_committed;
SELECT valid FROM intent.validate_result('shape', '42');
ROLLBACK;
SELECT intent.define_contract('shape', '{"type": "object", "required": ["url"], "minProperties": 2}') AS version;
SELECT valid, errors FROM intent.validate_result('shape', '42');

-- 17. A contract redefined in the same transaction is validated against its new schema at
--     once, and against the old one again when redefined back; freezing the rows changes
--     nothing. (The compiled schema is cached by the schema itself, not by a row version.)
BEGIN;
SELECT intent.define_contract('flip', '{"type": "object", "required": ["a"]}') AS version;
SELECT valid FROM intent.validate_result('flip', '{"b": 1}');
SELECT intent.define_contract('flip', '{"type": "object", "required": ["b"]}') AS version;
SELECT valid FROM intent.validate_result('flip', '{"b": 1}');
SELECT intent.define_contract('flip', '{"type": "object", "required": ["a"]}') AS version;
SELECT valid FROM intent.validate_result('flip', '{"b": 1}');
COMMIT;
VACUUM (FREEZE) intent.contracts;
SELECT valid FROM intent.validate_result('flip', '{"b": 1}');
SELECT intent.define_contract('flip', '{"type": "object", "required": ["b"]}') AS version;
SELECT valid FROM intent.validate_result('flip', '{"b": 1}');

-- 18. Validation checks for interrupts in every schema position (a keyword pg_intent adds
--     before compiling). It must change no answer: schemas where an added key would matter if it
--     were put in the wrong place — maps of properties, closed objects, data in enum and const,
--     anchors, $ref between schema positions — each with a value that passes and one that fails.
CREATE TEMP TABLE semantics (schema jsonb, good jsonb, bad jsonb);
INSERT INTO semantics VALUES
  ('{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false}',
   '{"a": 1}', '{"a": 1, "x-pg-intent-interrupt-check": true}'),
  ('{"type": "object", "properties": {"a": true}, "unevaluatedProperties": false}',
   '{"a": 1}', '{"b": 1}'),
  ('{"patternProperties": {"^x": {"type": "string"}}, "additionalProperties": false}',
   '{"xa": "s"}', '{"y": "s"}'),
  ('{"dependentRequired": {"a": ["b"]}}', '{"a": 1, "b": 2}', '{"a": 1}'),
  ('{"dependentSchemas": {"a": {"required": ["c"]}}}', '{"a": 1, "c": 2}', '{"a": 1}'),
  ('{"enum": [{"k": 1}, {"k": 2}]}', '{"k": 2}', '{"k": 2, "x-pg-intent-interrupt-check": true}'),
  ('{"const": {"k": {"deep": true}}}', '{"k": {"deep": true}}', '{"k": {"deep": true, "x-pg-intent-interrupt-check": true}}'),
  ('{"$defs": {"n": {"$anchor": "num", "type": "number"}}, "items": {"$ref": "#num"}}', '[1, 2.5]', '[1, "x"]'),
  ('{"prefixItems": [{"type": "string"}], "items": false}', '["a"]', '["a", 1]'),
  ('{"if": {"properties": {"t": {"const": "a"}}}, "then": {"required": ["x"]}, "else": {"required": ["y"]}}',
   '{"t": "b", "y": 1}', '{"t": "a", "y": 1}'),
  ('{"not": {"anyOf": [{"type": "string"}, {"oneOf": [{"type": "integer"}, {"minimum": 5}]}]}}', '7', '3'),
  ('{"properties": {"enum": {"properties": {"const": {"type": "string"}}}}}',
   '{"enum": {"const": "s"}}', '{"enum": {"const": 1}}'),
  ('{"contains": {"type": "null"}, "propertyNames": {"maxLength": 3}}', '[1, null]', '[1]'),
  ('{"properties": {"a": {"$ref": "#/properties/b"}, "b": {"type": "boolean"}}}', '{"a": true}', '{"a": 1}'),
  ('{"$id": "urn:k", "$defs": {"n": {"type": "integer", "maximum": 3}}, "$ref": "urn:k#/$defs/n"}', '2', '4'),
  ('{"$id": "https://example.com/root", "$defs": {"n": {"$id": "urn:inner", "type": "integer"}},
     "properties": {"a": {"$ref": "urn:inner"}}}', '{"a": 1}', '{"a": "x"}'),
  ('{"$dynamicAnchor": "node", "type": "object", "properties": {"kids": {"type": "array", "items": {"$dynamicRef": "#node"}}}}',
   '{"kids": [{"kids": []}]}', '{"kids": [1]}'),
  ('{"pattern": "^[a-z]+\\d{2}$"}', '"ab12"', '"ab1"');
CREATE FUNCTION pg_temp.judge(s jsonb, good jsonb, bad jsonb, OUT good_is_valid boolean, OUT bad_is_valid boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM intent.define_contract('semantics', s);
    good_is_valid := (SELECT valid FROM intent.validate_result('semantics', good));
    bad_is_valid := (SELECT valid FROM intent.validate_result('semantics', bad));
END $$;
SELECT n, (pg_temp.judge(schema, good, bad)).*
  FROM (SELECT row_number() OVER () AS n, * FROM semantics) s ORDER BY n;

-- 19. Schemas whose validation could not be bounded are refused when defined (22023, saying
--     why): a $ref off the schema positions (into data, a map of names, an unknown keyword, by
--     fragment or by $id), a relative $id, a $dynamicAnchor off them, a pattern that needs
--     backtracking.
CREATE TEMP TABLE unbounded (why text, schema jsonb);
INSERT INTO unbounded VALUES
  ('ref into an unknown keyword', '{"$ref": "#/x-library/positive", "x-library": {"positive": {"type": "integer"}}}'),
  ('ref into an enum value', '{"$ref": "#/enum/0", "enum": [{"type": "integer"}, 1]}'),
  ('ref into default', '{"default": {"a": {"allOf": [{"$ref": "#/default/a"}]}}, "$ref": "#/default/a"}'),
  ('ref by $id into an unknown keyword', '{"$id": "urn:k", "x": {"n": {"type": "integer"}}, "$ref": "urn:k#/x/n"}'),
  ('ref to a map of properties', '{"properties": {"a": {"type": "string"}}, "$defs": {"p": {"$ref": "#/properties"}}}'),
  ('ref to a map of definitions', '{"$defs": {"const": {"k": 1}}, "$ref": "#/$defs"}'),
  ('ref to dependentRequired', '{"dependentRequired": {"a": ["b"]}, "$defs": {"r": {"$ref": "#/dependentRequired"}}}'),
  ('ref to a document elsewhere', '{"$ref": "https://example.com/other.json"}'),
  ('relative $id', '{"$defs": {"a": {"$id": "a.json", "type": "string"}}}'),
  ('dynamic anchor in data', '{"examples": [{"$dynamicAnchor": "x"}], "$dynamicRef": "#x"}'),
  ('back-reference', '{"pattern": "^(a|a)*\\1c$"}'),
  ('look-ahead', '{"patternProperties": {"^(?=a)": true}}');
CREATE FUNCTION pg_temp.refusal(s jsonb) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM intent.define_contract('unbounded', s);
    RETURN 'accepted';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
END $$;
SELECT why, pg_temp.refusal(schema) AS answer FROM unbounded;

-- 20. A checker is stored by its identity (schema-qualified name and argument types; pg_upgrade
--     keeps no function oids), found again at every validation, even in a schema the calling
--     role may not use. Quoted names round-trip. Renamed, it is detached: results are rejected,
--     saying so, until the contract is redefined. A temporary function cannot be a checker
--     (22023): a contract outlives the session.
CREATE SCHEMA "Odd Schema";
CREATE FUNCTION "Odd Schema"."has a ""url"""(r jsonb) RETURNS boolean LANGUAGE sql STABLE
    AS $$ SELECT r ? 'url' $$;
SELECT intent.define_contract('odd', '{"type": "object"}', '"Odd Schema"."has a ""url"""(jsonb)');
SELECT checker, checker_owner FROM intent.contracts WHERE name = 'odd';
SELECT valid, errors FROM intent.validate_result('odd', '{"url": "u"}');
SELECT valid, errors FROM intent.validate_result('odd', '{"no": "url"}');
ALTER FUNCTION "Odd Schema"."has a ""url"""(jsonb) RENAME TO renamed;
SELECT valid, errors FROM intent.validate_result('odd', '{"url": "u"}');
SELECT intent.define_contract('odd', '{"type": "object"}', '"Odd Schema".renamed(jsonb)');
SELECT valid, errors FROM intent.validate_result('odd', '{"url": "u"}');
CREATE FUNCTION pg_temp.temporary_check(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT true';
SELECT field, regexp_replace(value, 'pg_temp_[0-9]+', 'pg_temp_N') AS value
  FROM t.error_of($$SELECT intent.define_contract('temp', '{}', 'pg_temp.temporary_check(jsonb)')$$);
SELECT count(*) AS temp_contracts FROM intent.contracts WHERE name = 'temp';

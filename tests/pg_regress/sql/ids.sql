-- ids: the derivations of docs/reference.md § 1.4. A job id is derived from (owner_id, idempotency_key),
-- never random; an attempt id is the job id with attempt_no in its last two bytes, so an
-- attempt id names its job. intent.job_id, intent.attempt_id and intent.job_of are immutable
-- and strict (NULL in, NULL out); malformed input raises 22023 (invalid_parameter_value).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql

-- 1. The test vectors of docs/reference.md § 1.4. Every line must say t: the client library reproduces the same
--    values, so any change here breaks every other layer's routing.
SELECT owner_id, idempotency_key, intent.job_id(owner_id, idempotency_key) AS job_id,
       intent.job_id(owner_id, idempotency_key) = expected AS matches_spec
  FROM (VALUES ('alice', 'click-1', '62ccd04c-f6e5-82dd-aeee-a9dac8090000'::uuid),
               ('bob', 'click-1', '7f0bee31-33f4-8d37-a75f-6be579b60000'),
               ('tenant-42', 'order-2026-11-30-0001', '7a4ffde0-bffb-854b-acd8-945a08ef0000'),
               ('ö', 'ключ', '3978066c-a3db-84e2-8d3c-9400b3c00000')) AS v(owner_id, idempotency_key, expected);

SELECT intent.attempt_id(intent.job_id('alice', 'click-1'), 1) AS alice_attempt_1,
       intent.attempt_id(intent.job_id('alice', 'click-1'), 1) = '62ccd04c-f6e5-82dd-aeee-a9dac8090001' AS matches_spec;

-- 2. Attempt ids: the number, big-endian, in the last two bytes ("attempt 2 of job
--    …a9dac8090000 is …a9dac8090002"), up to 65535; job_of takes it back off.
SELECT n, intent.attempt_id('62ccd04c-f6e5-82dd-aeee-a9dac8090000', n) AS attempt_id,
       intent.job_of(intent.attempt_id('62ccd04c-f6e5-82dd-aeee-a9dac8090000', n)) AS job_of
  FROM unnest(ARRAY[1, 2, 255, 256, 4660, 65535]) AS n;

-- 3. The derivation, recomputed here in plain SQL from the words of docs/reference.md § 1.4:
--    h = SHA-256(UTF-8(owner_id) || 0x00 || UTF-8(idempotency_key)), first 16 bytes,
--    version nibble 8 (b[6] & 0x0F | 0x80), RFC 9562 variant (b[8] & 0x3F | 0x80), b[14] = b[15] = 0.
CREATE FUNCTION t.spec_job_id(owner_id text, idempotency_key text) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT encode(set_byte(set_byte(set_byte(set_byte(b,
           6, (get_byte(b, 6) & 15) | 128),
           8, (get_byte(b, 8) & 63) | 128),
           14, 0), 15, 0), 'hex')::uuid
    FROM (SELECT substring(sha256(convert_to(owner_id, 'UTF8') || '\x00'::bytea
                                  || convert_to(idempotency_key, 'UTF8')) FROM 1 FOR 16) AS b) AS s
$$;
-- 3000 generated keys (ASCII, Latin-1, Cyrillic, CJK and emoji, 1 to 255 characters): the
-- extension and the formula of docs/reference.md § 1.4 must agree on every one.
SELECT count(*) AS keys,
       count(*) FILTER (WHERE intent.job_id(o, k) IS DISTINCT FROM t.spec_job_id(o, k)) AS mismatches
  FROM (SELECT 'owner-' || (i % 7) AS o,
               left(repeat(chr(CASE i % 5 WHEN 0 THEN 97 + i % 26 WHEN 1 THEN 228 WHEN 2 THEN 1082
                                          WHEN 3 THEN 26376 ELSE 128512 + i % 50 END) || i::text, 255),
                    1 + i % 255) AS k
          FROM generate_series(1, 3000) AS i) AS g;

-- 4. Keys are compared byte for byte: no Unicode normalisation, no case folding, no trimming,
--    and the 0x00 separator keeps ('a','bc') apart from ('ab','c').
SELECT intent.job_id('o', U&'caf\00E9') = intent.job_id('o', U&'cafe\0301') AS nfc_equals_nfd,
       intent.job_id('o', 'Key') = intent.job_id('o', 'key') AS case_folded,
       intent.job_id('o', 'key ') = intent.job_id('o', 'key') AS trimmed,
       intent.job_id('a', 'bc') = intent.job_id('ab', 'c') AS separator_lost;

-- 5. Lengths are counted in characters, not bytes: 255 'ö' (510 bytes) is a valid key,
--    256 characters are not, whatever they are.
SELECT intent.job_id(repeat('ö', 255), repeat('ключ', 63) || 'клю') = t.spec_job_id(repeat('ö', 255), repeat('ключ', 63) || 'клю') AS max_length_ok,
       char_length(repeat('ключ', 63) || 'клю') AS key_chars;
SELECT intent.job_id('o', repeat('k', 256));
\echo SQLSTATE :SQLSTATE
SELECT intent.job_id(repeat('ö', 256), 'k');
\echo SQLSTATE :SQLSTATE
SELECT intent.job_id('o', repeat('😀', 256));
\echo SQLSTATE :SQLSTATE
SELECT intent.job_id('', 'k');
\echo SQLSTATE :SQLSTATE
SELECT intent.job_id('o', '');
\echo SQLSTATE :SQLSTATE

-- 6. attempt_no must fit the last two bytes: 1 to 65535.
SELECT intent.attempt_id(intent.job_id('alice', 'click-1'), 0);
\echo SQLSTATE :SQLSTATE
SELECT intent.attempt_id(intent.job_id('alice', 'click-1'), -1);
\echo SQLSTATE :SQLSTATE
SELECT intent.attempt_id(intent.job_id('alice', 'click-1'), 65536);
\echo SQLSTATE :SQLSTATE

-- 7. An attempt id is not a job id and vice versa: attempt_id() refuses an id whose last two
--    bytes are not zero, job_of() refuses one whose last two bytes are zero.
SELECT intent.attempt_id('62ccd04c-f6e5-82dd-aeee-a9dac8090001', 1);
\echo SQLSTATE :SQLSTATE
SELECT intent.job_of('62ccd04c-f6e5-82dd-aeee-a9dac8090000');
\echo SQLSTATE :SQLSTATE

-- 8. Strict: NULL in any argument gives NULL, never an error.
SELECT intent.job_id(NULL, 'k') IS NULL AS owner_null,
       intent.job_id('o', NULL) IS NULL AS key_null,
       intent.attempt_id(NULL, 1) IS NULL AS job_null,
       intent.attempt_id(intent.job_id('o', 'k'), NULL) IS NULL AS no_null,
       intent.job_of(NULL) IS NULL AS attempt_null;

-- 9. Declared immutable, strict and parallel safe, so they can be used in indexes, CHECK
--    constraints and routing expressions.
SELECT p.oid::regprocedure AS function, p.provolatile AS volatility, p.proisstrict AS strict,
       p.proparallel AS parallel
  FROM pg_proc p
 WHERE p.pronamespace = 'intent'::regnamespace AND p.proname IN ('job_id', 'attempt_id', 'job_of')
 ORDER BY 1::text;

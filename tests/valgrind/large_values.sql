-- The large-value corpus of the valgrind pass (scripts/valgrind.sh): every path that returns a
-- stored value, with values of every size class, several times in one session. Under memcheck a
-- read of freed memory shows even when the answer happens to be right. The same corpus, with
-- byte-for-byte comparisons, is tests/tests/large_values.rs.
\set ON_ERROR_STOP 1
CREATE EXTENSION IF NOT EXISTS pg_intent;
CREATE TEMP TABLE sizes (n int, doc jsonb);
INSERT INTO sizes
SELECT n, jsonb_build_object('v', (SELECT string_agg(md5(n::text || g::text), '') FROM generate_series(1, greatest(n / 32, 1)) g))
  FROM unnest(ARRAY[10, 1500, 9000, 20000, 320000, 1000000]) n;
CREATE FUNCTION pg_temp.fill() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    s record;
    a1 uuid;
    a2 uuid;
BEGIN
    FOR s IN SELECT * FROM sizes z
              WHERE NOT EXISTS (SELECT FROM intent.jobs j WHERE j.id = intent.job_id('vg', 'k' || z.n)) LOOP
        PERFORM intent.submit_job('vg', 'k' || s.n, 'gpu', '{}');
        SELECT attempt_id INTO a1 FROM intent.begin_attempt(intent.job_id('vg', 'k' || s.n));
        PERFORM intent.abandon_attempt(a1, 'stalled');
        SELECT attempt_id INTO a2 FROM intent.begin_attempt(intent.job_id('vg', 'k' || s.n));
        PERFORM intent.complete_attempt(a2, 1, s.doc);
        PERFORM intent.complete_attempt(a1, 1, s.doc);
    END LOOP;
END $$;
SELECT pg_temp.fill();
-- Replays, one by one and in a batch, compared with what was stored.
SELECT s.n, (SELECT result FROM intent.submit_job('vg', 'k' || s.n, 'gpu', '{}')) = s.doc AS same
  FROM sizes s, generate_series(1, 3) ORDER BY 1;
SELECT count(*) FILTER (WHERE b.result = s.doc) AS same, count(*) AS of
  FROM sizes s
  JOIN intent.submit_jobs((SELECT array_agg('vg'::text) FROM sizes), (SELECT array_agg('k' || n ORDER BY n) FROM sizes),
                          (SELECT array_agg('gpu'::text) FROM sizes), (SELECT array_agg('{}'::jsonb) FROM sizes)) b
    ON b.job_id = intent.job_id('vg', 'k' || s.n);
SELECT count(*) FILTER (WHERE late_result = s.doc AND winning_result = s.doc) AS same, count(*) AS of
  FROM intent.lost_races r JOIN sizes s ON r.idempotency_key = 'k' || s.n;
-- Results of several megabytes (results may be up to 16 MiB), through the same paths.
INSERT INTO sizes SELECT 4000000, jsonb_build_object('v', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 125000) g));
SELECT pg_temp.fill();
SELECT s.n, (SELECT result FROM intent.submit_job('vg', 'k' || s.n, 'gpu', '{}')) = s.doc AS same
  FROM sizes s, generate_series(1, 2) WHERE s.n = 4000000;
SELECT count(*) FILTER (WHERE late_result = s.doc AND winning_result = s.doc) AS same, count(*) AS of
  FROM intent.lost_races r JOIN sizes s ON r.idempotency_key = 'k' || s.n;
-- Validation of large results against a contract with a checker.
CREATE FUNCTION public.has_v(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT r ? 'v' $$;
SELECT intent.define_contract('vg-shape', '{"type": "object", "required": ["v"]}', 'public.has_v(jsonb)');
SELECT n, (SELECT valid FROM intent.validate_result('vg-shape', doc)) FROM sizes ORDER BY n;

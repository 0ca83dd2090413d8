-- The epilogue of act 2 (harness/examples/failover_demo.rs): the evidence behind the failover,
-- as a DBA reads it. Run by scripts/demo.sh after the example.
\set ON_ERROR_STOP on
\pset footer off
\pset null '∅'

\echo
\echo '══ What a DBA sees: the evidence behind each failover ═══════════════════════════════════'
\echo 'intent.certifications (only gpu-b passed: a refused provider leaves no row)'
SELECT id, provider, contract, contract_version,
       evidence->'summary' AS summary,
       evidence->'settings'->'temperature' AS temperature,
       evidence->'settings'->'provider'->>'model' AS model,
       date_trunc('second', certified_at) AS certified_at,
       date_trunc('second', expires_at) AS expires_at,
       revoked_at
  FROM intent.certifications ORDER BY id;
\echo 'One case of the evidence: its input and the first of its runs'
SELECT c->>'name' AS "case", c->'input' AS input, c->'passed' AS passed, c->'runs'->0 AS first_run
  FROM intent.certifications, jsonb_array_elements(evidence->'cases') AS c
 WHERE provider = 'gpu-b' LIMIT 1;
\echo 'intent.certifications_expiring (the certification that counts, per provider and contract)'
SELECT provider, contract, justify_interval(date_trunc('second', expires_in)) AS expires_in, current
  FROM intent.certifications_expiring;
\echo 'intent.attempts of bob''s job'
SELECT attempt_no, provider, state, worker, result, error FROM intent.attempts
 WHERE job_id = intent.job_id('bob', 'caption-1') ORDER BY attempt_no;
\echo 'What the harness saw through each tokenizer: gpu-b''s rendering checks, first case'
SELECT check_->>'check' AS "check", check_->'passed' AS passed, check_->>'detail' AS detail
  FROM intent.certifications,
       jsonb_array_elements(evidence->'cases'->0->'rendering'->'checks') AS check_
 WHERE provider = 'gpu-b';
\echo 'intent.attempts and intent.events of carol''s job (the unknown attempt, settled by the reconciler)'
SELECT attempt_no, provider, state, worker, result->>'caption' AS caption, error FROM intent.attempts
 WHERE job_id = intent.job_id('carol', 'caption-2') ORDER BY attempt_no;
SELECT kind, detail FROM intent.events
 WHERE job_id = intent.job_id('carol', 'caption-2') ORDER BY id;

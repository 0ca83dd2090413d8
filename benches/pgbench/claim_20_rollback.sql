-- A claim of 20 that leaves the table as it found it (benches/run.py --held-snapshot): the same
-- claim, against the same rows, every transaction.
BEGIN;
SELECT count(*) FROM intent.claim_attempts(ARRAY['gpu-a'], 'bench', '30 seconds', 20);
ROLLBACK;

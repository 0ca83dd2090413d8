-- A worker's claim of 20, committed (benches/run.py --held-snapshot).
SELECT count(*) FROM intent.claim_attempts(ARRAY['gpu-a'], 'bench', '30 seconds', 20);

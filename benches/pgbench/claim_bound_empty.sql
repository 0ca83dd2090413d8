SELECT count(*) FROM intent.claim_attempts(ARRAY['gpu-a'], 'bench-' || :client_id);

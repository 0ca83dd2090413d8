SELECT attempt_id, version FROM intent.claim_attempts(ARRAY['gpu-a'], 'bench-' || :client_id) \gset
SELECT intent.complete_attempt(:attempt_id, :version, '{"image": "blob://cat.png"}');

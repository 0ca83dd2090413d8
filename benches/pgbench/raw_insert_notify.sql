\set k random(1, 9223372036854775806)
BEGIN;
INSERT INTO bench.jobs (id, owner_id, idempotency_key, provider, params, retry_at)
VALUES (intent.job_id('owner-' || :client_id, 'key-' || :k), 'owner-' || :client_id, 'key-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}', now())
ON CONFLICT DO NOTHING RETURNING id;
SELECT pg_notify('intent_claimable', 'gpu-a');
COMMIT;

\set k random(1, 9223372036854775806)
INSERT INTO bench.jobs (id, owner_id, idempotency_key, provider, params, retry_at)
VALUES (intent.job_id('owner-' || :client_id, 'life-' || :k), 'owner-' || :client_id, 'life-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}', now())
ON CONFLICT DO NOTHING RETURNING id AS job_id \gset
INSERT INTO bench.attempts (id, job_id, owner_id, attempt_no, provider, state, version_read, lease, started_at, deadline)
VALUES (intent.attempt_id(:job_id, 1), :job_id, 'owner-' || :client_id, 1, 'gpu-a', 'started', 1, '30 seconds', now(), now() + interval '30 seconds')
RETURNING id AS attempt_id \gset
UPDATE bench.jobs SET state = 'succeeded', retry_at = NULL, result = '{"image": "blob://cat.png"}', completed_by = :attempt_id, version = version + 1
 WHERE id = :job_id AND version = 1 AND completed_by IS NULL;

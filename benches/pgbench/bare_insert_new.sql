\set k random(1, 9223372036854775806)
INSERT INTO bench.bare_jobs (id, owner_id, idempotency_key, provider, params)
VALUES (gen_random_uuid(), 'owner-' || :client_id, 'key-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}')
ON CONFLICT DO NOTHING RETURNING id;

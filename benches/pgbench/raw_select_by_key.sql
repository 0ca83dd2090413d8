\set k random(1, :keys)
SELECT id, state, version, result FROM bench.jobs WHERE owner_id = 'replay-owner' AND idempotency_key = 'replay-' || :k;

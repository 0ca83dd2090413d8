\set k random(1, 9223372036854775806)
SELECT count(*) FROM intent.submit_jobs(
    array_fill('owner-' || :client_id, ARRAY[100]),
    ARRAY(SELECT 'batch-' || :k || '-' || g FROM generate_series(1, 100) g),
    array_fill('gpu-a'::text, ARRAY[100]),
    array_fill('{"prompt": "a cat in a hat", "size": 512}'::jsonb, ARRAY[100]));

\set k random(1, 9223372036854775806)
SELECT unnest(procrastinate_defer_jobs_v1(ARRAY[ROW('default', 'generate', 0, NULL, 'new-' || :k, '{"prompt": "a cat in a hat", "size": 512}', NULL)]::procrastinate_job_to_defer_v1[])) AS id;

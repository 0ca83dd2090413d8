\set k random(1, :dup_keys)
SELECT peers.procrastinate_defer_or_already_enqueued(ARRAY[ROW('default', 'generate', 0, NULL, 'dup-' || :k, '{"prompt": "a cat in a hat", "size": 512}', NULL)]::procrastinate_job_to_defer_v1[]) AS id;

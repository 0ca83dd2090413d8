SELECT b.attempt_id, b.version
  FROM (SELECT id FROM intent.jobs
         WHERE state = 'pending' AND attempt_count < max_attempts AND (retry_at IS NULL OR retry_at <= now())
           AND provider = 'gpu-a'
         ORDER BY coalesce(retry_at, updated_at) LIMIT 1
           FOR NO KEY UPDATE SKIP LOCKED) j,
       LATERAL intent.begin_attempt(j.id, NULL, '30 seconds', 'bench-' || :client_id) b \gset
SELECT intent.complete_attempt(:attempt_id, :version, '{"image": "blob://cat.png"}');

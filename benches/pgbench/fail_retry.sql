\set k random(1, 9223372036854775806)
SELECT job_id FROM intent.submit_job('owner-' || :client_id, 'retry-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}') \gset
SELECT attempt_id, version FROM intent.begin_attempt(:job_id) \gset
SELECT intent.heartbeat(:attempt_id);
SELECT intent.fail_attempt(:attempt_id, :version, '{"kind": "rate_limited"}', true, interval '0');
SELECT attempt_id, version FROM intent.begin_attempt(:job_id) \gset
SELECT intent.complete_attempt(:attempt_id, :version, '{"image": "blob://cat.png"}');

\set k random(1, 9223372036854775806)
SELECT job_id FROM bench.p_submit_job('owner-' || :client_id, 'life-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}') \gset
SELECT attempt_id, version FROM bench.p_begin_attempt(:job_id) \gset
SELECT bench.p_complete_attempt(:attempt_id, :version, '{"image": "blob://cat.png"}');

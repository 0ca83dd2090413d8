\set k random(1, 9223372036854775806)
SELECT job_id FROM intent.submit_job('owner-' || :client_id, 'unknown-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}') \gset
SELECT attempt_id, version FROM intent.begin_attempt(:job_id) \gset
SELECT intent.mark_unknown(:attempt_id, 'client timeout');
SELECT intent.abandon_attempt(:attempt_id, 'the provider has no record of it');
SELECT intent.cancel_job(:job_id, 'the user gave up');

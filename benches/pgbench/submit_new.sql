\set k random(1, 9223372036854775806)
SELECT job_id FROM intent.submit_job('owner-' || :client_id, 'key-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}');

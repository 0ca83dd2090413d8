\set k random(1, :keys)
SELECT job_id, state, version, result FROM intent.submit_job('replay-owner', 'replay-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}');

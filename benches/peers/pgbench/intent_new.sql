\set k random(1, 9223372036854775806)
SELECT * FROM intent.submit_job('peers-owner', 'new-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}');

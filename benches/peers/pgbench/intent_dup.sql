\set k random(1, :dup_keys)
SELECT * FROM intent.submit_job('peers-owner', 'dup-' || :k, 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}');

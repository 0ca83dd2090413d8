SELECT * FROM intent.submit_job('peers-owner', 'the-one-key', 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}');

SELECT job_id FROM intent.submit_job('hammer-owner', 'the-one-key', 'gpu-a', '{"prompt": "a cat in a hat", "size": 512}');

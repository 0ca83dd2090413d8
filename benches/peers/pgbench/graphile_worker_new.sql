\set k random(1, 9223372036854775806)
select * from graphile_worker.add_job(identifier => 'generate'::text, payload => '{"prompt": "a cat in a hat", "size": 512}'::json, queue_name => NULL::text, run_at => NULL::timestamptz, max_attempts => NULL::int, job_key => ('new-' || :k)::text, priority => NULL::int, flags => NULL::text[], job_key_mode => (:mode)::text);

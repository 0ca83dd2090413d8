//! The fixture: jobs in every state, which every call of the corpus aims at and none may
//! change, and ids that name nothing.

use super::*;

// --- the fixture ---------------------------------------------------------------------------------

/// Jobs in every state, made before the corpus runs. Every call of the corpus aimed at them is
/// refused, or is a documented no-op: none may change them.
pub struct Fixture {
    pub pending: Uuid,
    pub running: Uuid,
    pub r1: Begun,
    pub unknown: Uuid,
    pub u1: Begun,
    pub succeeded: Uuid,
    pub s1: Begun,
    /// l1 abandoned, l2 won, then l1's result lost.
    pub lost: Uuid,
    pub l1: Begun,
    pub l2: Begun,
    pub failed: Uuid,
    pub f1: Begun,
    pub cancelled: Uuid,
    /// Still started, under a cancelled job.
    pub c1: Begun,
    /// max_attempts 1, its one attempt abandoned.
    pub exhausted: Uuid,
    pub x1: Begun,
    /// With a contract; j1's result was rejected.
    pub rejected: Uuid,
    pub j1: Begun,
    /// Submits of the fixture's jobs, and what a replay of each answers.
    pub replays: Vec<(String, String, Value, Option<&'static str>, String)>,
    /// md5 of the text of the 3 MiB result of job "large".
    pub large_md5: String,
}

/// The fixture's contracts whose checkers misbehave, and what validating `{}` against each
/// answers ('valid' and what the checker tried to leave behind, which must not stay).
pub const MISBEHAVING: &[(&str, &str)] = &[
    ("checker-raises", "false"),
    ("checker-null", "false"),
    ("checker-writes", "true 0"),
    ("checker-settings", "true 4MB \"$user\", public"),
    ("checker-calls-pg-intent", "false"),
    ("checker-made-volatile", "false"),
];

/// The misbehaving checkers (see [`MISBEHAVING`]) and a schema whose validation doubles with
/// each of its 34 levels.
pub const HOSTILE_CONTRACTS: &str = "
    CREATE TABLE public.checker_scratch (x int);
    CREATE FUNCTION public.c_raises(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS
        $$ BEGIN RAISE EXCEPTION 'no'; END $$;
    CREATE FUNCTION public.c_null(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT NULL::boolean';
    CREATE FUNCTION public.scribble() RETURNS void LANGUAGE sql VOLATILE AS
        'INSERT INTO public.checker_scratch VALUES (1)';
    CREATE FUNCTION public.c_writes(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS
        $$ BEGIN PERFORM public.scribble(); RETURN true; END $$;
    CREATE FUNCTION public.c_settings(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS
        $$ BEGIN PERFORM set_config('work_mem', '64kB', false); PERFORM set_config('search_path', 'pg_temp', false);
                 RETURN true; END $$;
    CREATE FUNCTION public.c_calls(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS
        $$ BEGIN PERFORM intent.sweep(); RETURN true; END $$;
    CREATE FUNCTION public.c_volatile(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT true';
    SELECT intent.define_contract('checker-raises', '{}', 'public.c_raises(jsonb)'),
           intent.define_contract('checker-null', '{}', 'public.c_null(jsonb)'),
           intent.define_contract('checker-writes', '{}', 'public.c_writes(jsonb)'),
           intent.define_contract('checker-settings', '{}', 'public.c_settings(jsonb)'),
           intent.define_contract('checker-calls-pg-intent', '{}', 'public.c_calls(jsonb)'),
           intent.define_contract('checker-made-volatile', '{}', 'public.c_volatile(jsonb)');
    ALTER FUNCTION public.c_volatile(jsonb) VOLATILE;";

impl Fixture {
    pub async fn build(c: &Client) -> Fixture {
        assert!(
            ensure_contract(c, "unused").await,
            "contracts are supported"
        );
        c.query(
            "SELECT intent.define_contract($1, '{\"type\": \"object\", \"required\": [\"image\"]}')",
            &[&CONTRACT],
        )
        .await
        .expect("define the contract");
        let mut replays = Vec::new();
        let job = async |key: &str, max_attempts: i32, contract: Option<&'static str>| {
            let params = json!({"key": key, "prompt": "a cat"});
            let s = submit_full(c, "fx", key, PROVIDER, &params, contract, max_attempts)
                .await
                .unwrap();
            (s.job_id, params)
        };
        let (pending, p_params) = job("pending", 3, None).await;
        let (running, r_params) = job("running", 3, None).await;
        let r1 = begin(c, running, None, "2 hours").await.unwrap();
        let (unknown, u_params) = job("unknown", 3, None).await;
        let u1 = begin(c, unknown, None, "2 hours").await.unwrap();
        mark_unknown(c, u1.attempt_id, Some("timer")).await.unwrap();
        let (succeeded, s_params) = job("succeeded", 3, None).await;
        let s1 = begin(c, succeeded, None, "2 hours").await.unwrap();
        assert_eq!(
            complete(c, s1.attempt_id, 1, &json!({"image": "s1"}))
                .await
                .unwrap(),
            "won"
        );
        // The first late failure is logged; the corpus only repeats it.
        fail(c, s1.attempt_id, 1, &json!({"late": true}), true)
            .await
            .unwrap();
        let (lost, l_params) = job("lost", 3, None).await;
        let l1 = begin(c, lost, None, "2 hours").await.unwrap();
        abandon(c, l1.attempt_id, "stuck").await.unwrap();
        let l2 = begin(c, lost, None, "2 hours").await.unwrap();
        assert_eq!(
            complete(c, l2.attempt_id, 1, &json!({"image": "l2"}))
                .await
                .unwrap(),
            "won"
        );
        assert_eq!(
            complete(c, l1.attempt_id, 1, &json!({"image": "l1"}))
                .await
                .unwrap(),
            "lost"
        );
        fail(c, l1.attempt_id, 1, &json!({"late": true}), true)
            .await
            .unwrap();
        fail(c, l2.attempt_id, 1, &json!({"late": true}), true)
            .await
            .unwrap();
        let (failed, f_params) = job("failed", 3, None).await;
        let f1 = begin(c, failed, None, "2 hours").await.unwrap();
        assert_eq!(
            fail(c, f1.attempt_id, 1, &json!({"status": 400}), false)
                .await
                .unwrap(),
            "failed"
        );
        assert_eq!(
            complete(c, f1.attempt_id, 1, &json!({"image": "f1"}))
                .await
                .unwrap(),
            "lost"
        );
        let (cancelled, c_params) = job("cancelled", 3, None).await;
        let c1 = begin(c, cancelled, None, "2 hours").await.unwrap();
        assert!(cancel(c, cancelled, Some("changed my mind")).await.unwrap());
        let (exhausted, x_params) = job("exhausted", 1, None).await;
        let x1 = begin(c, exhausted, None, "2 hours").await.unwrap();
        abandon(c, x1.attempt_id, "gone").await.unwrap();
        let (rejected, j_params) = job("rejected", 3, Some(CONTRACT)).await;
        let j1 = begin(c, rejected, None, "2 hours").await.unwrap();
        assert_eq!(
            complete(c, j1.attempt_id, 1, &json!({"nope": 1}))
                .await
                .unwrap(),
            "rejected"
        );

        // A job whose result is 3 MiB: replays must return it whole, and write nothing.
        let (large, _) = job("large", 3, None).await;
        let g1 = begin(c, large, None, "2 hours").await.unwrap();
        let big = json!({"blob": "b".repeat(3 * MIB), "tail": "\u{1F980}"});
        assert_eq!(complete(c, g1.attempt_id, 1, &big).await.unwrap(), "won");
        let large_md5: String = c
            .query_one(
                "SELECT md5(result::text) FROM intent.jobs WHERE id = $1",
                &[&large],
            )
            .await
            .unwrap()
            .get(0);
        c.batch_execute(HOSTILE_CONTRACTS)
            .await
            .expect("the misbehaving checkers");
        let doubling = {
            let mut defs = serde_json::Map::new();
            for i in 0..34 {
                let next = format!("#/$defs/d{}", i + 1);
                defs.insert(
                    format!("d{i}"),
                    json!({"anyOf": [{"allOf": [{"$ref": next}, {"type": "string"}]}, {"$ref": next}]}),
                );
            }
            defs.insert("d34".into(), json!({"type": "integer"}));
            json!({"$defs": defs, "$ref": "#/$defs/d0"})
        };
        c.query(
            "SELECT intent.define_contract('doubling', $1)",
            &[&doubling],
        )
        .await
        .unwrap();

        for (key, id, params, contract) in [
            ("pending", pending, p_params, None),
            ("running", running, r_params, None),
            ("unknown", unknown, u_params, None),
            ("succeeded", succeeded, s_params, None),
            ("lost", lost, l_params, None),
            ("failed", failed, f_params, None),
            ("cancelled", cancelled, c_params, None),
            ("exhausted", exhausted, x_params, None),
            ("rejected", rejected, j_params, Some(CONTRACT)),
        ] {
            let answer: String = c
                .query_one(
                    "SELECT format('%s %s %s %s', id, false, state, version) FROM intent.jobs WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap()
                .get(0);
            replays.push(("fx".to_string(), key.to_string(), params, contract, answer));
        }
        Fixture {
            pending,
            running,
            r1,
            unknown,
            u1,
            succeeded,
            s1,
            lost,
            l1,
            l2,
            failed,
            f1,
            cancelled,
            c1,
            exhausted,
            x1,
            rejected,
            j1,
            replays,
            large_md5,
        }
    }

    /// Attempts that exist (for wrong-version calls).
    pub fn attempts(&self) -> Vec<&Begun> {
        vec![
            &self.r1, &self.u1, &self.s1, &self.l1, &self.l2, &self.f1, &self.c1, &self.x1,
            &self.j1,
        ]
    }

    /// Attempts that already have an outcome (or are abandoned, or unknown): timers, heartbeats
    /// and abandons on them are documented no-ops.
    pub fn settled(&self) -> Vec<&Begun> {
        vec![&self.s1, &self.l1, &self.l2, &self.f1, &self.x1, &self.j1]
    }
}

/// An id that names nothing: a random UUID, a derived job that was never submitted, an attempt
/// a real job never had, a job id where an attempt id belongs.
pub fn unknown_attempt(rng: &mut Rng, fx: &Fixture) -> (Uuid, &'static str) {
    match rng.below(4) {
        0 => (
            Uuid::from_u64_pair(rng.next_u64(), rng.next_u64() | 1),
            "a random uuid",
        ),
        1 => (
            attempt_id_of(job_id_of("nobody", &format!("k{}", rng.below(1000))), 1),
            "an attempt of no job",
        ),
        2 => (
            attempt_id_of(fx.lost, rng.between(3, 65535)),
            "an attempt its job never had",
        ),
        _ => (
            *rng.pick(&[fx.pending, fx.running, fx.succeeded]),
            "a job id",
        ),
    }
}

pub fn unknown_job(rng: &mut Rng, fx: &Fixture) -> (Uuid, &'static str) {
    match rng.below(3) {
        0 => (
            Uuid::from_u64_pair(rng.next_u64(), rng.next_u64()),
            "a random uuid",
        ),
        1 => (
            job_id_of(&good_name(rng), &good_name(rng)),
            "a derived id never submitted",
        ),
        _ => (fx.r1.attempt_id, "an attempt id"),
    }
}

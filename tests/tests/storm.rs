//! Storms: many connections working the same jobs at the same instant, round after round —
//! identical submits mixed with conflicting payloads, concurrent begins, duplicate deliveries of
//! a result, abandons and late results racing the next attempt, timers, failures, cancels.
//!
//! Every answer every connection gets is recorded, and after each round the answers are checked
//! against the final rows: one job per intent and exactly one caller told `created`; an IJ001
//! only for params that really differ; every attempt handed out exists and was handed out once;
//! at most one attempt ever told `won`, and it is the job's `completed_by` with its result on
//! the job; every attempt told `lost` is discarded (its result kept on its own row) or had
//! failed; a cancel that said `true` left a cancelled job nobody won; no error but the
//! documented refusals. Then the invariants of docs/protocol.md are checked in SQL over all rows, and no
//! backend may have crashed.
//!
//! Scale: `PG_INTENT_FULL=1` → 64 connections × 1,000 rounds; the default (CI) is 64 × 12.
//! `PG_INTENT_STORM_ROUNDS`, `PG_INTENT_STORM_CONNECTIONS` and `PG_INTENT_SEED` override.

use pg_intent_tests::reliability::{
    CrashWatch, Figures, Rng, Violations, full, index_violations, invariant_violations, scale, seed,
};
use pg_intent_tests::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PROVIDER: &str = "gpu-east";

/// What a call answered: its value, or the SQLSTATE (or, for anything but a server error, a
/// description — always a violation in a storm: nothing here should break a connection).
type Answer<T> = Result<T, String>;

fn answer<T>(r: Result<T, tokio_postgres::Error>) -> Answer<T> {
    r.map_err(|e| match e.as_db_error() {
        // The refusals the storm expects are matched on their code alone.
        Some(db) if db.code().code().starts_with("IJ") => db.code().code().to_string(),
        // Anything else is a violation: keep what the server said about it.
        Some(db) => format!(
            "{} ({}; DETAIL: {}; CONTEXT: {})",
            db.code().code(),
            db.message(),
            db.detail().unwrap_or("none"),
            db.where_().unwrap_or("none")
        ),
        None => format!("not a server error: {e}"),
    })
}

#[derive(Debug, Clone)]
enum Call {
    Submit {
        params: Value,
        answer: Answer<Submitted>,
    },
    Begin {
        answer: Answer<Begun>,
    },
    Complete {
        attempt: Uuid,
        answer: Answer<String>,
    },
    Fail {
        attempt: Uuid,
        retryable: bool,
        answer: Answer<String>,
    },
    Abandon {
        attempt: Uuid,
        answer: Answer<()>,
    },
    MarkUnknown {
        attempt: Uuid,
        answer: Answer<()>,
    },
    Heartbeat {
        attempt: Uuid,
        answer: Answer<bool>,
    },
    Cancel {
        answer: Answer<bool>,
    },
}

/// One recorded call: which connection made it, on which key of the round.
#[derive(Debug, Clone)]
struct Record {
    conn: usize,
    key: usize,
    call: Call,
}

/// The result an attempt reports: fixed per attempt, so that every delivery of it is the same
/// document and the job's result names its winner.
fn result_of(attempt: Uuid) -> Value {
    json!({"attempt": attempt.to_string(), "image": format!("blob://{attempt}")})
}

fn intent_of(round: usize, key: usize) -> (String, String) {
    (format!("owner-{}", key % 3), format!("r{round}-k{key}"))
}

fn canonical_params(round: usize, key: usize) -> Value {
    json!({"prompt": "a cat in a hat", "round": round, "key": key, "size": [1024, 1024]})
}

/// The attempts begun so far on each key of the round, for the connections that did not get
/// one: a duplicate delivery, an operator, a timer, all act on attempts someone else began.
type Board = Arc<Mutex<HashMap<usize, Vec<Begun>>>>;

/// One connection's part of a round.
async fn connection_script(
    c: Arc<Client>,
    conn: usize,
    key: usize,
    round: usize,
    mut rng: Rng,
    board: Board,
    heartbeats: bool,
) -> Vec<Record> {
    let mut log = Log {
        conn,
        key,
        records: Vec::new(),
    };
    let (owner, idem) = intent_of(round, key);
    let job = job_id_of(&owner, &idem);
    let params = if rng.percent(12) {
        json!({"prompt": "a dog", "round": round, "key": key, "from": conn})
    } else {
        canonical_params(round, key)
    };
    let max_attempts = *rng.pick(&[2, 3, 3, 3, 4]);
    let submitted =
        answer(submit_full(&c, &owner, &idem, PROVIDER, &params, None, max_attempts).await);
    let ok = submitted.is_ok();
    log.push(Call::Submit {
        params,
        answer: submitted,
    });
    if !ok {
        return log.records;
    }

    for _ in 0..4 {
        let lease = if rng.percent(4) {
            "20 milliseconds"
        } else {
            "1 minute"
        };
        let begun = answer(begin(&c, job, None, lease).await);
        log.push(Call::Begin {
            answer: begun.clone(),
        });
        match begun {
            Ok(b) => {
                board
                    .lock()
                    .unwrap()
                    .entry(key)
                    .or_default()
                    .push(b.clone());
                let gate_open = work_own_attempt(&c, &b, &mut rng, &mut log, heartbeats).await;
                if !gate_open {
                    break;
                }
            }
            Err(code) if code == "IJ002" || code == "IJ003" => {
                let others = board.lock().unwrap().get(&key).cloned().unwrap_or_default();
                if !others.is_empty() {
                    let b = rng.pick(&others).clone();
                    help_with(&c, &b, &mut rng, &mut log, heartbeats).await;
                }
                tokio::time::sleep(Duration::from_micros(rng.between(0, 2000) as u64)).await;
            }
            Err(_) => break,
        }
    }
    if rng.percent(2) {
        let cancelled = answer(cancel(&c, job, Some("the user gave up")).await);
        log.push(Call::Cancel { answer: cancelled });
    }
    log.records
}

/// One connection's calls, in order.
struct Log {
    conn: usize,
    key: usize,
    records: Vec<Record>,
}

impl Log {
    fn push(&mut self, call: Call) {
        self.records.push(Record {
            conn: self.conn,
            key: self.key,
            call,
        });
    }
}

/// Delivers attempt `b`'s result.
async fn complete_own(c: &Client, b: &Begun, log: &mut Log) {
    let a = answer(complete(c, b.attempt_id, b.version, &result_of(b.attempt_id)).await);
    log.push(Call::Complete {
        attempt: b.attempt_id,
        answer: a,
    });
}

/// The worker that began attempt `b` reports on it. Returns whether the gate may be open again
/// (so the connection should try to begin the next attempt).
async fn work_own_attempt(
    c: &Client,
    b: &Begun,
    rng: &mut Rng,
    log: &mut Log,
    heartbeats: bool,
) -> bool {
    let id = b.attempt_id;
    match rng.below(100) {
        // The provider answered.
        0..45 => complete_own(c, b, log).await,
        // A long job: keep the lease alive, then answer.
        45..55 => {
            if heartbeats {
                let alive = answer(heartbeat(c, id, Some("1 minute")).await);
                log.push(Call::Heartbeat {
                    attempt: id,
                    answer: alive,
                });
            }
            complete_own(c, b, log).await;
        }
        // The provider said nothing happened: retry.
        55..65 => {
            let state = answer(fail(c, id, b.version, &json!({"status": 503}), true).await);
            log.push(Call::Fail {
                attempt: id,
                retryable: true,
                answer: state,
            });
            return true;
        }
        // The provider refused for good.
        65..70 => {
            let state = answer(fail(c, id, b.version, &json!({"status": 400}), false).await);
            log.push(Call::Fail {
                attempt: id,
                retryable: false,
                answer: state,
            });
        }
        // An operator gives up on it; the result arrives anyway, racing the next attempt.
        70..85 => {
            let abandoned = answer(abandon(c, id, "stuck in the provider's queue").await);
            log.push(Call::Abandon {
                attempt: id,
                answer: abandoned,
            });
            tokio::time::sleep(Duration::from_micros(rng.between(0, 3000) as u64)).await;
            complete_own(c, b, log).await;
            return true;
        }
        // The caller's timer fires; then the result turns up, or an operator gives up.
        85..95 => {
            let marked = answer(mark_unknown(c, id, Some("client timeout")).await);
            log.push(Call::MarkUnknown {
                attempt: id,
                answer: marked,
            });
            if rng.percent(50) {
                complete_own(c, b, log).await;
            } else {
                let abandoned = answer(abandon(c, id, "gave up waiting").await);
                log.push(Call::Abandon {
                    attempt: id,
                    answer: abandoned,
                });
                return true;
            }
        }
        // The worker vanished: the attempt stays open.
        _ => {}
    }
    false
}

/// A connection that could not begin acts on an attempt someone else began: a duplicate
/// delivery of its result, an operator, a timer, a heartbeat, a duplicate failure report.
async fn help_with(c: &Client, b: &Begun, rng: &mut Rng, log: &mut Log, heartbeats: bool) {
    let id = b.attempt_id;
    match rng.below(100) {
        0..40 => {
            let a = answer(complete(c, id, b.version, &result_of(id)).await);
            log.push(Call::Complete {
                attempt: id,
                answer: a,
            });
        }
        40..60 => {
            let a = answer(abandon(c, id, "operator: not waiting any more").await);
            log.push(Call::Abandon {
                attempt: id,
                answer: a,
            });
        }
        60..75 => {
            let a = answer(mark_unknown(c, id, Some("gateway timeout")).await);
            log.push(Call::MarkUnknown {
                attempt: id,
                answer: a,
            });
        }
        75..95 if heartbeats => {
            let a = answer(heartbeat(c, id, None).await);
            log.push(Call::Heartbeat {
                attempt: id,
                answer: a,
            });
        }
        75..95 => {
            let a = answer(complete(c, id, b.version, &result_of(id)).await);
            log.push(Call::Complete {
                attempt: id,
                answer: a,
            });
        }
        _ => {
            let retryable = rng.percent(50);
            let a = answer(fail(c, id, b.version, &json!({"status": 502}), retryable).await);
            log.push(Call::Fail {
                attempt: id,
                retryable,
                answer: a,
            });
        }
    }
}

/// The final rows of one job, as the checks need them.
#[derive(Debug, Default)]
struct Final {
    job: Option<JobRow>,
    owner_key: Option<(String, String)>,
    max_attempts: i32,
    attempts: BTreeMap<Uuid, AttemptRow>,
    late_results: BTreeSet<Uuid>,
}

async fn final_rows(c: &Client, jobs: &[Uuid]) -> HashMap<Uuid, Final> {
    let mut out: HashMap<Uuid, Final> = jobs.iter().map(|j| (*j, Final::default())).collect();
    for row in c
        .query(
            "SELECT id, state::text, version, completed_by, result, error, attempt_count,
                    provider, params, contract, owner_id, idempotency_key, max_attempts
               FROM intent.jobs WHERE id = ANY($1)",
            &[&jobs],
        )
        .await
        .expect("read jobs")
    {
        let f = out.get_mut(&row.get::<_, Uuid>(0)).expect("asked for");
        f.owner_key = Some((row.get(10), row.get(11)));
        f.max_attempts = row.get(12);
        f.job = Some(JobRow {
            id: row.get(0),
            state: row.get(1),
            version: row.get(2),
            completed_by: row.get(3),
            result: row.get(4),
            error: row.get(5),
            attempt_count: row.get(6),
            provider: row.get(7),
            params: row.get(8),
            contract: row.get(9),
        });
    }
    for row in c
        .query(
            "SELECT job_id, id, attempt_no, provider, state::text, version_read,
                    finished_at IS NOT NULL, result, error
               FROM intent.attempts WHERE job_id = ANY($1)",
            &[&jobs],
        )
        .await
        .expect("read attempts")
    {
        let a = AttemptRow {
            id: row.get(1),
            attempt_no: row.get(2),
            provider: row.get(3),
            state: row.get(4),
            version_read: row.get(5),
            finished: row.get(6),
            result: row.get(7),
            error: row.get(8),
        };
        out.get_mut(&row.get::<_, Uuid>(0))
            .expect("asked for")
            .attempts
            .insert(a.id, a);
    }
    for row in c
        .query(
            "SELECT job_id, attempt_id FROM intent.events
              WHERE job_id = ANY($1) AND kind = 'late_result' AND attempt_id IS NOT NULL",
            &[&jobs],
        )
        .await
        .expect("read events")
    {
        out.get_mut(&row.get::<_, Uuid>(0))
            .expect("asked for")
            .late_results
            .insert(row.get(1));
    }
    out
}

/// Counts of what the round's checks found, for the figures.
#[derive(Debug, Default)]
struct Tally {
    calls: usize,
    duplicate_jobs: usize,
    second_winners: usize,
    won: usize,
    lost: usize,
    conflicts: usize,
    refusals: usize,
}

/// Checks every answer given on one key against the key's final rows.
fn check_key(
    round: usize,
    key: usize,
    records: &[&Record],
    f: &Final,
    v: &Violations,
    tally: &mut Tally,
) {
    let (owner, idem) = intent_of(round, key);
    let job_id = job_id_of(&owner, &idem);
    let at = |what: String| format!("round {round} key {key} ({owner}, {idem}): {what}");
    tally.calls += records.len();

    let Some(job) = &f.job else {
        v.push(at("no job row, though every caller submitted".into()));
        return;
    };
    v.check(
        f.owner_key.as_ref() == Some(&(owner.clone(), idem.clone())),
        || at(format!("job row has owner/key {:?}", f.owner_key)),
    );

    // Submits: one creator, its params are the job's; IJ001 exactly for other params.
    let mut created = 0;
    for r in records {
        let Call::Submit { params, answer } = &r.call else {
            continue;
        };
        match answer {
            Ok(s) => {
                created += usize::from(s.created);
                v.check(s.job_id == job_id, || {
                    at(format!("conn {} was given job {}", r.conn, s.job_id))
                });
                v.check(*params == job.params, || {
                    at(format!(
                        "conn {} submitted {params} and was given the job with params {}",
                        r.conn, job.params
                    ))
                });
                if s.created {
                    v.check(s.version == 1 && s.state == "pending", || {
                        at(format!("creator conn {} was told {s:?}", r.conn))
                    });
                }
            }
            Err(code) if code == "IJ001" => {
                tally.conflicts += 1;
                v.check(*params != job.params, || {
                    at(format!(
                        "conn {} got IJ001 for the job's own params {params}",
                        r.conn
                    ))
                });
            }
            Err(code) => v.push(at(format!("conn {} submit failed with {code}", r.conn))),
        }
    }
    if created != 1 {
        tally.duplicate_jobs += created.saturating_sub(1);
        v.push(at(format!("{created} callers were told created = true")));
    }

    // Begins: every attempt handed out exists, once, with the version it was given.
    let mut handed_out = BTreeSet::new();
    for r in records {
        let Call::Begin { answer } = &r.call else {
            continue;
        };
        match answer {
            Ok(b) => {
                v.check(handed_out.insert(b.attempt_no), || {
                    at(format!("attempt no {} handed out twice", b.attempt_no))
                });
                v.check(
                    b.attempt_id == attempt_id_of(job_id, i64::from(b.attempt_no)),
                    || at(format!("attempt {} is not the derived id", b.attempt_id)),
                );
                match f.attempts.get(&b.attempt_id) {
                    Some(a) => v.check(a.version_read == b.version, || {
                        at(format!(
                            "attempt {} read {} but was told {}",
                            a.id, a.version_read, b.version
                        ))
                    }),
                    None => v.push(at(format!(
                        "attempt {} was handed out but has no row",
                        b.attempt_id
                    ))),
                }
            }
            Err(code) if matches!(code.as_str(), "IJ002" | "IJ003" | "IJ004" | "IJ006") => {
                tally.refusals += 1;
            }
            Err(code) => v.push(at(format!("conn {} begin failed with {code}", r.conn))),
        }
    }
    v.check(handed_out.len() == f.attempts.len(), || {
        at(format!(
            "{} attempts handed out, {} rows",
            handed_out.len(),
            f.attempts.len()
        ))
    });
    v.check(job.attempt_count as usize == f.attempts.len(), || {
        at(format!(
            "attempt_count {} with {} rows",
            job.attempt_count,
            f.attempts.len()
        ))
    });

    // Completions: one winner at most; it is the job's outcome; every loser is discarded with
    // its result kept, or had failed; no attempt is told both.
    let mut told: BTreeMap<Uuid, BTreeSet<&str>> = BTreeMap::new();
    for r in records {
        let Call::Complete { attempt, answer } = &r.call else {
            continue;
        };
        match answer {
            Ok(a) => {
                told.entry(*attempt).or_default().insert(a.as_str());
            }
            Err(code) => v.push(at(format!(
                "conn {} complete {attempt} failed with {code}",
                r.conn
            ))),
        }
    }
    let winners: Vec<Uuid> = told
        .iter()
        .filter(|(_, answers)| answers.contains("won"))
        .map(|(a, _)| *a)
        .collect();
    if winners.len() > 1 {
        tally.second_winners += winners.len() - 1;
        v.push(at(format!(
            "second winner: attempts {winners:?} were all told won"
        )));
    }
    for (attempt, answers) in &told {
        v.check(answers.len() == 1, || {
            at(format!("attempt {attempt} was told {answers:?}"))
        });
        let row = f.attempts.get(attempt);
        for a in answers {
            match *a {
                "won" => {
                    tally.won += 1;
                    v.check(
                        job.state == "succeeded" && job.completed_by == Some(*attempt),
                        || {
                            at(format!(
                                "attempt {attempt} was told won; job is {} by {:?}",
                                job.state, job.completed_by
                            ))
                        },
                    );
                    v.check(job.result == Some(result_of(*attempt)), || {
                        at(format!("job result {:?} is not the winner's", job.result))
                    });
                    v.check(row.is_some_and(|r| r.state == "succeeded"), || {
                        at(format!("winner {attempt} is {:?}", row.map(|r| &r.state)))
                    });
                }
                "lost" => {
                    tally.lost += 1;
                    // (A lost result of an attempt whose failure ended the job is fine: it is
                    // that job's completed_by, as a failure.)
                    v.check(
                        !(job.state == "succeeded" && job.completed_by == Some(*attempt)),
                        || at(format!("attempt {attempt} was told lost but won the job")),
                    );
                    match row.map(|r| r.state.as_str()) {
                        Some("discarded") => {
                            v.check(row.unwrap().result == Some(result_of(*attempt)), || {
                                at(format!("lost attempt {attempt} did not keep its result"))
                            });
                            v.check(f.late_results.contains(attempt), || {
                                at(format!("lost attempt {attempt} has no late_result event"))
                            });
                        }
                        Some("failed") => {}
                        other => v.push(at(format!(
                            "attempt {attempt} was told lost but is {other:?}"
                        ))),
                    }
                }
                other => v.push(at(format!("attempt {attempt} was told {other}"))),
            }
        }
    }
    if job.state == "succeeded" {
        v.check(
            job.completed_by.is_some_and(|w| winners.contains(&w)),
            || {
                at(format!(
                    "job succeeded by {:?}, but nobody was told won for it",
                    job.completed_by
                ))
            },
        );
    }

    // Failures, cancels, abandons, timers: their answers hold in the final rows.
    let mut cancels = 0;
    let mut told_failed = BTreeSet::new();
    let mut failed_for_good = BTreeSet::new();
    for r in records {
        match &r.call {
            Call::Fail {
                attempt,
                retryable,
                answer,
            } => match answer {
                Ok(state) if matches!(state.as_str(), "succeeded" | "failed" | "cancelled") => {
                    v.check(job.state == *state, || {
                        at(format!(
                            "fail {attempt} answered {state}, the job is {}",
                            job.state
                        ))
                    });
                    if state == "failed" {
                        told_failed.insert(*attempt);
                        if !*retryable {
                            failed_for_good.insert(*attempt);
                        }
                    }
                }
                Ok(_) => {}
                Err(code) => v.push(at(format!("fail {attempt} failed with {code}"))),
            },
            Call::Cancel { answer } => match answer {
                Ok(true) => {
                    cancels += 1;
                    v.check(job.state == "cancelled" && winners.is_empty(), || {
                        at(format!(
                            "cancel said true; job is {}, winners {winners:?}",
                            job.state
                        ))
                    });
                }
                // The job had already ended (checked below: a cancelled job had one cancel).
                Ok(false) => {}
                Err(code) => v.push(at(format!("cancel failed with {code}"))),
            },
            Call::Abandon { attempt, answer } => match answer {
                Ok(()) => {
                    let state = f.attempts.get(attempt).map(|a| a.state.as_str());
                    v.check(!matches!(state, Some("started" | "unknown") | None), || {
                        at(format!("attempt {attempt} was abandoned but is {state:?}"))
                    });
                }
                Err(code) => v.push(at(format!("abandon {attempt} failed with {code}"))),
            },
            Call::MarkUnknown { attempt, answer } => match answer {
                Ok(()) => {
                    let state = f.attempts.get(attempt).map(|a| a.state.as_str());
                    v.check(!matches!(state, Some("started") | None), || {
                        at(format!(
                            "attempt {attempt} was marked unknown but is {state:?}"
                        ))
                    });
                }
                Err(code) => v.push(at(format!("mark_unknown {attempt} failed with {code}"))),
            },
            Call::Heartbeat { attempt, answer } => {
                if let Err(code) = answer {
                    v.push(at(format!("heartbeat {attempt} failed with {code}")));
                }
            }
            Call::Submit { .. } | Call::Begin { .. } | Call::Complete { .. } => {}
        }
    }
    v.check(cancels <= 1, || at(format!("{cancels} cancels said true")));
    v.check((job.state == "cancelled") == (cancels == 1), || {
        at(format!(
            "job is {} after {cancels} successful cancels",
            job.state
        ))
    });
    if job.state == "failed" {
        v.check(
            job.completed_by.is_some_and(|a| told_failed.contains(&a)),
            || {
                at(format!(
                    "job failed by {:?}, whose failure report was not answered 'failed'",
                    job.completed_by
                ))
            },
        );
        // A retryable failure ends the job only when no attempt is left.
        v.check(
            job.completed_by
                .is_some_and(|a| failed_for_good.contains(&a))
                || job.attempt_count >= f.max_attempts,
            || {
                at(format!(
                    "job failed by {:?} on a retryable failure with {} of {} attempts used",
                    job.completed_by, job.attempt_count, f.max_attempts
                ))
            },
        );
    }
}

/// The storm: `rounds` rounds of `connections` connections (see the module docs). With
/// `heartbeats`, workers and bystanders also heartbeat attempts that others are changing.
async fn storm(name: &str, heartbeats: bool) {
    let rounds = scale("PG_INTENT_STORM_ROUNDS", 12, 1000);
    let connections = scale("PG_INTENT_STORM_CONNECTIONS", 64, 64);
    let mut rng = Rng::new(seed(name));
    let mut figures = Figures::new(name);

    let cluster = Cluster::shared();
    let db = cluster.fresh_db(name).await;
    let watch = CrashWatch::start(cluster, &db.name).await;
    let observer = db.connect().await;
    let clients = db.connect_many(connections, "storm").await;
    let v = Violations::new();
    let mut tally = Tally::default();
    let mut rounds_run = 0;

    for round in 0..rounds {
        rounds_run += 1;
        // Most rounds spread the connections over 8 keys; every fourth puts all of them on one.
        let keys = if round % 4 == 3 {
            1
        } else {
            8.min(connections)
        };
        let board: Board = Arc::default();
        let rngs: Vec<Rng> = (0..connections).map(|i| rng.fork(i as u64)).collect();
        let logs = stampede(&clients, |i, c| {
            connection_script(
                c,
                i,
                i % keys,
                round,
                rngs[i].clone(),
                board.clone(),
                heartbeats,
            )
        })
        .await;
        let records: Vec<Record> = logs.into_iter().flatten().collect();
        let jobs: Vec<Uuid> = (0..keys)
            .map(|k| {
                let (o, i) = intent_of(round, k);
                job_id_of(&o, &i)
            })
            .collect();
        let rows = final_rows(&observer, &jobs).await;
        for (k, job) in jobs.iter().enumerate() {
            let mine: Vec<&Record> = records.iter().filter(|r| r.key == k).collect();
            check_key(round, k, &mine, &rows[job], &v, &mut tally);
        }
        if round % 100 == 99 || round + 1 == rounds {
            v.extend(invariant_violations(&observer).await);
        }
        if v.count() > 0 {
            break; // stop early: the first violations tell the story
        }
    }
    v.extend(invariant_violations(&observer).await);
    v.extend(index_violations(&observer).await);
    v.extend(watch.crashes(cluster).await);

    let d = digest(&observer).await;
    figures
        .set("rounds", rounds_run)
        .set("connections", connections)
        .set("calls", tally.calls)
        .set("jobs", d.jobs)
        .set("attempts", d.attempts)
        .set("won", tally.won)
        .set("lost", tally.lost)
        .set("conflicts", tally.conflicts)
        .set("refusals", tally.refusals)
        .set("duplicate_jobs", tally.duplicate_jobs)
        .set("second_winners", tally.second_winners)
        .set("violations", v.count())
        .set("full", full());
    figures.print();
    v.assert_none(name);
    assert!(
        tally.won > 0 && tally.lost > 0 && tally.conflicts > 0 && tally.refusals > 0,
        "the storm exercised wins, losses, conflicts and refusals: {tally:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storms_of_identical_conflicting_and_racing_calls_keep_every_answer_true() {
    storm("storm", false).await;
}

/// The same storm with heartbeats racing the timers, operators and deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storms_with_racing_heartbeats_keep_every_answer_true() {
    storm("storm_heartbeats", true).await;
}

/// docs/protocol.md § Concurrency: "Every call that changes a job locks the job row first …
/// so concurrent calls on one job serialize and cannot deadlock each other". A worker that
/// heartbeats and completes in one transaction while another delivery of the same result
/// arrives must therefore get `won` (and the other delivery `won` too, a replay), never 40P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_then_complete_in_one_transaction_never_deadlocks() {
    let db = Cluster::shared().fresh_db("storm_deadlock").await;
    let worker = db.connect().await;
    let duplicate = db.connect_as("storm_duplicate_delivery").await;
    let observer = db.connect().await;
    let s = submit(&worker, "u", "k", PROVIDER, &json!({}))
        .await
        .unwrap();
    let a = begin(&worker, s.job_id, None, "1 hour").await.unwrap();

    worker.batch_execute("BEGIN").await.unwrap();
    assert!(heartbeat(&worker, a.attempt_id, None).await.unwrap());
    let other = tokio::spawn(async move {
        answer(
            complete(
                &duplicate,
                a.attempt_id,
                a.version,
                &result_of(a.attempt_id),
            )
            .await,
        )
    });
    wait_for_lock_waiters(
        &observer,
        "storm_duplicate_delivery",
        1,
        Duration::from_secs(30),
    )
    .await;
    let mine = answer(complete(&worker, a.attempt_id, a.version, &result_of(a.attempt_id)).await);
    let commit = answer(worker.batch_execute("COMMIT").await);
    let theirs = other.await.unwrap();
    assert_eq!(
        (mine, commit, theirs),
        (Ok("won".to_string()), Ok(()), Ok("won".to_string())),
        "both deliveries of the one result are told won; nobody gets 40P01"
    );
}

/// rule 1 (README) under the simplest storm: identical submits at the same instant all get the job
/// (one of them `created`), never an error. A unique violation (23505) from any unique index of
/// intent.jobs means the insert does not treat every conflict as "the key exists". Regression
/// test for commit 23efd8e (ON CONFLICT arbitrated the key constraint only; fixed in f33c227),
/// which the storm found; tests/mutations/reliability_arbiter_on_key_only.sql reproduces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_identical_submits_never_surface_a_unique_violation() {
    let mut errors = Vec::new();
    // A fresh database and fresh connections for each batch: the storm saw this most on the
    // first calls of new sessions (cold caches widen the race between the arbiter's check and
    // the insertion into the other unique index).
    for batch in 0..3 {
        let db = Cluster::shared().fresh_db("storm_submit_race").await;
        let clients = db.connect_many(64, "storm_submit_race").await;
        for round in 0..2 {
            let answers = stampede(&clients, |i, c| async move {
                let key = format!("race-{batch}-{round}-{}", i % 8);
                answer(submit(&c, "racer", &key, PROVIDER, &json!({"n": i % 8})).await)
            })
            .await;
            let created = answers
                .iter()
                .filter(|a| matches!(a, Ok(s) if s.created))
                .count();
            errors.extend(answers.into_iter().filter_map(Result::err));
            assert!(created <= 8, "round {round}: {created} creators for 8 keys");
        }
    }
    assert!(
        errors.is_empty(),
        "{} errors, e.g. {:?}",
        errors.len(),
        errors.first()
    );
}

/// protocol.md § Concurrency: calls on one job serialize on the job row and cannot deadlock
/// each other. Heartbeats racing a timer, an operator and two deliveries of the result, all in
/// autocommit, must never see 40P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_racing_state_changes_never_deadlock() {
    let db = Cluster::shared().fresh_db("storm_heartbeat_race").await;
    let clients = db.connect_many(12, "storm_heartbeat_race").await;
    let c = db.connect().await;
    let mut errors = Vec::new();
    for round in 0..20 {
        let s = submit(&c, "hb", &format!("hb-{round}"), PROVIDER, &json!({}))
            .await
            .unwrap();
        let b = begin(&c, s.job_id, None, "1 minute").await.unwrap();
        let answers = stampede(&clients, |i, c| {
            let b = b.clone();
            async move {
                let id = b.attempt_id;
                match i % 6 {
                    0 => answer(mark_unknown(&c, id, Some("timer")).await).map(|_| ()),
                    1 => answer(abandon(&c, id, "operator").await),
                    2 => answer(complete(&c, id, b.version, &result_of(id)).await).map(|_| ()),
                    _ => {
                        for _ in 0..5 {
                            if !answer(heartbeat(&c, id, None).await)? {
                                break;
                            }
                        }
                        Ok(())
                    }
                }
            }
        })
        .await;
        errors.extend(answers.into_iter().filter_map(Result::err));
    }
    assert!(
        errors.is_empty(),
        "{} errors, e.g. {:?}",
        errors.len(),
        errors.first()
    );
}

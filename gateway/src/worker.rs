//! The gateway's worker: finds pending jobs and runs one attempt of each through the client's
//! [`Worker`] helper, which begins it, heartbeats while the provider works, marks it `unknown`
//! (never `failed`) when the timeout fires, and reports with the attempt's own fencing token.
//!
//! The database is the queue: `intent.jobs WHERE state = 'pending'`. The gate
//! (`begin_attempt`) lets one attempt through per job, so any number of workers, in any number
//! of gateway processes, may poll the same jobs. A job whose outcome is unknown is never retried
//! here: it waits for a person or a reconciler (docs/runbook.md).

use std::sync::Arc;

use pg_intent_client::{self as intent, Error, JobState, Run, Worker};
use uuid::Uuid;

use crate::{Gateway, Task, log};

/// The pending jobs that may begin an attempt, oldest change first.
const PENDING: &str = "SELECT id FROM intent.jobs
                        WHERE state = 'pending' AND attempt_count < max_attempts
                        ORDER BY updated_at
                        LIMIT $1";

impl Gateway {
    pub(crate) async fn work(&self) {
        let cfg = &self.inner.config.worker;
        let slots = Arc::new(tokio::sync::Semaphore::new(cfg.concurrency.max(1)));
        loop {
            match self.pending(cfg.concurrency.max(1) as i64 * 4).await {
                Ok(jobs) => {
                    for job_id in jobs {
                        if !self.inner.running.lock().unwrap().insert(job_id) {
                            continue; // this process is already running it
                        }
                        let Ok(slot) = slots.clone().acquire_owned().await else {
                            return;
                        };
                        let gw = self.clone();
                        tokio::spawn(async move {
                            gw.run_one(job_id).await;
                            gw.inner.running.lock().unwrap().remove(&job_id);
                            drop(slot);
                        });
                    }
                }
                Err(e) => log(&format!("worker: cannot list pending jobs: {e}")),
            }
            tokio::select! {
                () = self.inner.wake.notified() => {}
                () = tokio::time::sleep(cfg.poll_every) => {}
            }
        }
    }

    async fn pending(&self, limit: i64) -> Result<Vec<Uuid>, String> {
        let conn = self.inner.pool.get().await.map_err(|e| e.to_string())?;
        let rows = conn
            .query(PENDING, &[&limit])
            .await
            .map_err(|e| e.to_string())?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// One attempt of one job.
    async fn run_one(&self, job_id: Uuid) {
        let cfg = &self.inner.config.worker;
        let conn = match self.inner.pool.get().await {
            Ok(c) => c,
            Err(e) => return log(&format!("worker: no connection: {e}")),
        };
        let job = match intent::get_job(&conn, job_id).await {
            Ok(Some(job)) if job.state == JobState::Pending => job,
            Ok(_) => return,
            Err(e) => return log(&format!("worker: cannot read job {job_id}: {e}")),
        };
        let worker = Worker::new(&conn, cfg.timeout)
            .lease(cfg.lease)
            .name(cfg.name.clone());
        let provider = self.inner.provider.clone();
        let (provider_name, params) = (job.provider, job.params);
        let run = worker
            .run(job_id, None, move |attempt| {
                provider.call(Task {
                    attempt,
                    provider: provider_name,
                    params,
                })
            })
            .await;
        match run {
            Ok(Run::Completed {
                attempt,
                completion,
                ..
            }) => log(&format!("attempt {}: {completion}", attempt.id())),
            Ok(Run::Failed {
                attempt, job_state, ..
            }) => log(&format!(
                "attempt {} failed; job {job_id} is {job_state}",
                attempt.id()
            )),
            Ok(Run::Unknown { attempt, reason }) => log(&format!(
                "attempt {} is unknown ({reason}): reconcile it (docs/runbook.md)",
                attempt.id()
            )),
            Ok(Run::Stopped { attempt }) => log(&format!("attempt {} stopped", attempt.id())),
            // Another worker got there first, or the job is no longer ours to run.
            Err(
                Error::AttemptInFlight { .. }
                | Error::OutcomeUnknown { .. }
                | Error::JobFinished { .. }
                | Error::AttemptsExhausted { .. },
            ) => {}
            Err(e) => log(&format!("worker: job {job_id}: {e}")),
        }
    }
}

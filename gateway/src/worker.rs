//! The gateway's worker: a [`Runner`] of the client, which claims the attempts of claimable jobs
//! (`intent.claim_attempts`), runs each through the protocol — heartbeats while the provider
//! works, `unknown` (never `failed`) when the timeout fires, the report with the attempt's own
//! fencing token — and shuts down without failing an attempt it did not finish.
//!
//! The database is the queue: claims are disjoint, so any number of workers, in any number of
//! gateway processes, may run the same jobs' attempts. It wakes on `NOTIFY intent_claimable`
//! (with [`crate::WorkerConfig::listen`]) and when this process creates a job, and polls as a
//! fallback. A job whose outcome is unknown is never retried here: it waits for a person or a
//! reconciler (docs/runbook.md).

use std::future::Future;

use pg_intent_client::runner::{Event, Finish};
use pg_intent_client::{ClaimedAttempt, Runner};

use crate::{Gateway, Task, log};

impl Gateway {
    pub(crate) async fn work(&self, shutdown: impl Future<Output = ()>) {
        let config = &self.inner.config;
        let cfg = &config.worker;
        let mut runner = Runner::new(self.inner.pool.clone(), cfg.timeout)
            .provider(config.default_provider.clone())
            .providers(config.providers.iter().cloned())
            .concurrency(cfg.concurrency.max(1))
            .lease(cfg.lease)
            .poll_every(cfg.poll_every)
            .grace(cfg.grace)
            .name(cfg.name.clone())
            .wake_on(self.inner.wake.clone())
            .on_event(report);
        if let Some(listen) = &cfg.listen {
            runner = runner.listen(listen.clone());
        }
        runner = match cfg.purge_every {
            Some(every) => runner.purge_every(every),
            None => runner.purge(false),
        };
        let provider = self.inner.provider.clone();
        let summary = runner
            .run(
                move |claimed: ClaimedAttempt| {
                    provider.call(Task {
                        attempt: claimed.attempt,
                        provider: claimed.provider,
                        params: claimed.params,
                    })
                },
                shutdown,
            )
            .await;
        log(&format!("worker: shut down: {summary:?}"));
    }
}

fn report(event: Event) {
    match event {
        Event::Finished {
            attempt_id,
            finish: Finish::Unknown { reason },
            ..
        } => log(&format!(
            "attempt {attempt_id} is unknown ({reason}): reconcile it (docs/runbook.md)"
        )),
        Event::Finished {
            attempt_id,
            finish: Finish::ShutDown,
            ..
        } => log(&format!(
            "attempt {attempt_id} is unknown (the worker shut down): reconcile it (docs/runbook.md)"
        )),
        Event::Finished {
            attempt_id, finish, ..
        } => log(&format!("attempt {attempt_id}: {finish:?}")),
        Event::ClaimFailed { error } => log(&format!("worker: cannot claim: {error}")),
        Event::AttemptFailed { attempt_id, error } => log(&format!(
            "worker: attempt {attempt_id} left started, its lease will lapse: {error}"
        )),
        Event::ListenLost { error } => log(&format!("worker: not listening: {error}")),
        Event::Purged { jobs } => log(&format!(
            "worker: purged {jobs} finished jobs past the retention"
        )),
        Event::PurgeFailed { error } => log(&format!("worker: cannot purge: {error}")),
        _ => {}
    }
}

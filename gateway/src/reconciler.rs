//! The gateway's reconciler: `pg_intent_client::Reconciler` on a schedule. Every
//! [`ReconcilerConfig::every`] it takes a pooled connection, sweeps lapsed leases, and asks the
//! provider about each `unknown` attempt (the attempt id was the call's idempotency key):
//! finished → completed with the provider's output; never received or refused → failed as
//! retryable (the worker then runs the next attempt); still running → left; nobody can tell →
//! left, or abandoned once older than [`ReconcilerConfig::abandon_after`] when that is set.
//! docs/runbook.md § 2 has the rules; any number of gateways may run it, each decision is made
//! once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pg_intent_client::reconciler::{
    Decision, Lookup, LookupFuture, ProviderStatus, Reconciler, StatusLookup,
};
use pg_intent_client::{AttemptRecord, WorkError};
use serde_json::json;
use uuid::Uuid;

use crate::{BoxOutcome, Gateway, Provider, Task, fake_provider, log};

/// How the gateway's reconciler runs.
#[derive(Debug, Clone)]
pub struct ReconcilerConfig {
    /// Whether it runs at all (default `true`; `main`: `GATEWAY_RECONCILE=false` turns it off,
    /// and unknown attempts wait for a person, docs/runbook.md § 2).
    pub enabled: bool,
    /// The time from the end of one pass to the start of the next (default 30 s).
    pub every: Duration,
    /// Abandon an attempt nobody can tell about once it started this long ago: the work may
    /// then happen twice (runbook § 2.4). `None` (the default): never; such attempts are left
    /// to a person.
    pub abandon_after: Option<Duration>,
    /// At most this many `unknown` attempts per pass (default 100), taken in turns between the
    /// owners that have some, least recently served first (`pg_intent_client::reconciler`,
    /// *Fairness*).
    pub batch: u32,
    /// How long one status lookup may take (default 10 s); the attempt's transaction, on one
    /// pooled connection, stays open meanwhile. It is also the decision's `lock_timeout` (its
    /// `statement_timeout` twice that): a decision kept waiting for a lock, e.g. by a tenant's
    /// open transaction on the job's row, is left for a later pass (`Decision::Blocked`, logged)
    /// and the pass goes on.
    pub lookup_timeout: Duration,
    /// Who decides, as recorded in the decisions (`reconciled_by`).
    pub name: String,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        ReconcilerConfig {
            enabled: true,
            every: Duration::from_secs(30),
            abandon_after: None,
            batch: pg_intent_client::reconciler::DEFAULT_BATCH,
            lookup_timeout: pg_intent_client::reconciler::DEFAULT_LOOKUP_TIMEOUT,
            name: "gateway-reconciler".into(),
        }
    }
}

impl Gateway {
    /// Starts the reconciler, asking `lookup` (e.g. [`FakeProvider`], or
    /// `pg_intent_harness::RequestLookup` for OpenAI-compatible providers), until
    /// `shutdown` resolves (a pass in progress is then dropped: its open transaction rolls
    /// back, nothing half-decided stays). `None` when [`ReconcilerConfig::enabled`] is off.
    pub fn spawn_reconciler_until(
        &self,
        lookup: impl StatusLookup + 'static,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let cfg = self.inner.config.reconciler.clone();
        if !cfg.enabled {
            log("reconciler: off (unknown attempts wait for a person: docs/runbook.md § 2)");
            return None;
        }
        let mut reconciler = Reconciler::new(lookup)
            .batch(cfg.batch)
            .lookup_timeout(cfg.lookup_timeout)
            .name(cfg.name.clone());
        if let Some(age) = cfg.abandon_after {
            reconciler = reconciler.abandon_after(age);
        }
        let gw = self.clone();
        Some(tokio::spawn(async move {
            let mut shutdown = std::pin::pin!(shutdown);
            loop {
                tokio::select! {
                    () = &mut shutdown => break,
                    () = gw.reconcile_once(&reconciler) => {}
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(cfg.every) => {}
                }
            }
            log("reconciler: stopped");
        }))
    }

    async fn reconcile_once(&self, reconciler: &Reconciler) {
        let mut conn = match self.inner.pool.get().await {
            Ok(conn) => conn,
            Err(e) => return log(&format!("reconciler: no connection: {e}")),
        };
        let pass = match reconciler.run_once(&mut conn).await {
            Ok(pass) => pass,
            Err(e) => return log(&format!("reconciler: pass failed: {e}")),
        };
        let mut reopened = false;
        for r in &pass.reconciled {
            match &r.decision {
                Decision::Busy | Decision::AlreadyDecided(_) | Decision::Gone => {}
                decision => {
                    reopened |= matches!(decision, Decision::Failed(_) | Decision::Abandoned);
                    log(&format!(
                        "reconciler: attempt {} ({}): {decision}; evidence: {}",
                        r.attempt_id, r.provider, r.evidence
                    ));
                }
            }
        }
        for (attempt_id, e) in &pass.errors {
            log(&format!(
                "reconciler: attempt {attempt_id}: not reconciled: {e}"
            ));
        }
        if reopened {
            // A job went back to pending: the next attempt need not wait for the poll.
            self.inner.wake.notify_one();
        }
    }
}

/// [`fake_provider`] with a memory, so that a reconciler can ask it what became of a call:
/// each call is kept by attempt id, and its work goes on when the worker stops waiting (a GPU
/// does not stop because a client timed out). Its status lookup answers from that memory:
/// finished (done, with the output), refused (failed), still working (running); an attempt it
/// has no record of is "cannot tell", never "never received", since the memory is this
/// process's only and ends with it.
#[derive(Debug, Clone, Default)]
pub struct FakeProvider {
    calls: Arc<Mutex<HashMap<Uuid, ProviderStatus>>>,
}

impl FakeProvider {
    /// A fake provider that remembers nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn set(&self, attempt_id: Uuid, status: ProviderStatus) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(attempt_id, status);
    }
}

impl Provider for FakeProvider {
    fn call(&self, task: Task) -> BoxOutcome {
        let id = task.attempt.id();
        self.set(id, ProviderStatus::Running);
        let me = self.clone();
        let work = tokio::spawn(async move {
            let outcome = fake_provider(task).await;
            match &outcome {
                Ok(result) => me.set(id, ProviderStatus::Done(result.clone())),
                Err(WorkError::Failed { error, .. }) => {
                    me.set(id, ProviderStatus::Failed(error.clone()))
                }
                Err(WorkError::Unknown { .. }) => {}
            }
            outcome
        });
        Box::pin(async move {
            work.await.unwrap_or_else(|e| {
                Err(WorkError::unknown(format!(
                    "the fake provider's task ended: {e}"
                )))
            })
        })
    }
}

impl StatusLookup for FakeProvider {
    fn lookup<'a>(&'a self, attempt: &'a AttemptRecord) -> LookupFuture<'a> {
        let status = self
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&attempt.id)
            .cloned();
        Box::pin(async move {
            Ok(match status {
                Some(status) => {
                    Lookup::new(status).evidence(json!({"asked": "the fake provider's memory"}))
                }
                None => Lookup::new(ProviderStatus::CannotTell).evidence(json!({
                    "asked": "the fake provider's memory",
                    "says": "no record: kept in this process only, so it may have been done before a restart",
                })),
            })
        })
    }
}

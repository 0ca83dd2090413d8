//! What a worker runs each attempt with: its timeout, the lease and heartbeats, its name, how
//! long a report is retried and how long one call may wait. One type with its defaults, set on
//! a [`crate::Worker`] or on a [`crate::Runner`], which hands it to every worker it makes.

use std::time::Duration;

use crate::types::DEFAULT_LEASE;

/// How long a [`crate::Worker`] retries a report by default before it gives up and returns the
/// outcome in [`crate::Error::Unreported`].
pub const DEFAULT_REPORT_FOR: Duration = Duration::from_secs(300);

/// The settings of the attempts a [`crate::Worker`] runs (a [`crate::Runner`] sets its timeout,
/// lease, heartbeats and name with builder methods of the same names, for every worker it
/// makes; its workers retry reports and time calls out by the defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerSettings {
    /// The caller's own timeout of the work: when it fires the attempt becomes `unknown`.
    pub(crate) timeout: Duration,
    /// The lease of each attempt (heartbeats extend it by as much).
    pub(crate) lease: Duration,
    /// How often to heartbeat (`None`: a third of the lease).
    pub(crate) heartbeat_every: Option<Duration>,
    /// The worker's name in `intent.attempts`.
    pub(crate) name: Option<String>,
    /// How long a report is retried before the outcome is returned unreported.
    pub(crate) report_for: Duration,
    /// How long one report may wait for its answer (`None`: the lease).
    pub(crate) call_timeout: Option<Duration>,
}

impl WorkerSettings {
    /// The defaults, with the work's `timeout`: a 30-second lease ([`DEFAULT_LEASE`]),
    /// heartbeats every third of it, no name, reports retried for [`DEFAULT_REPORT_FOR`], each
    /// report waiting at most the lease.
    pub(crate) fn new(timeout: Duration) -> Self {
        WorkerSettings {
            timeout,
            lease: DEFAULT_LEASE,
            heartbeat_every: None,
            name: None,
            report_for: DEFAULT_REPORT_FOR,
            call_timeout: None,
        }
    }

    /// The interval between heartbeats.
    pub(crate) fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_every
            .unwrap_or(self.lease / 3)
            .max(Duration::from_millis(1))
    }

    /// How long one report or heartbeat may take before its connection is taken as broken:
    /// [`crate::Worker::call_timeout`]'s setting, by default the lease.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.call_timeout
            .unwrap_or(self.lease)
            .max(Duration::from_millis(1))
    }
}

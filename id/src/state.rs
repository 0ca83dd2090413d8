//! The state machine: the job and attempt states, which of them are open or terminal, the
//! deadline rule, and the table of every transition a call can make.
//!
//! The extension implements the transitions (in SQL, one statement per step); this module is
//! what they are checked against: the model check asserts that every transition it observes on
//! a real server is a row of [`TRANSITIONS`], and `docs/protocol.md` carries the same table
//! ([`transitions_markdown`], compared by a test).

use std::fmt;
use std::str::FromStr;

/// A label from the database that this code does not know (a newer extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownLabel {
    /// The type the label was read as (`job_state`, `attempt_state`, …).
    pub kind: &'static str,
    /// The label.
    pub label: String,
}

impl fmt::Display for UnknownLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} label {:?}", self.kind, self.label)
    }
}

impl std::error::Error for UnknownLabel {}

/// An enum whose variants are the labels of a PostgreSQL enum (or of a fixed set of words).
macro_rules! label_enum {
    ($(#[$doc:meta])* $name:ident, $kind:literal, { $($(#[$vdoc:meta])* $variant:ident = $label:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            /// Every label, in the order PostgreSQL declares them.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The label PostgreSQL uses.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $label,)* }
            }
        }

        impl FromStr for $name {
            type Err = UnknownLabel;

            fn from_str(s: &str) -> Result<Self, UnknownLabel> {
                match s {
                    $($label => Ok($name::$variant),)*
                    _ => Err(UnknownLabel { kind: $kind, label: s.to_string() }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

label_enum!(
    /// `intent.job_state`.
    JobState, "job_state", {
        /// No open attempt; one may begin.
        Pending = "pending",
        /// An attempt is started and within its lease.
        Running = "running",
        /// The open attempt's outcome is unknown: reconcile or abandon it.
        Unknown = "unknown",
        /// Terminal: one attempt's result won.
        Succeeded = "succeeded",
        /// Terminal: a definite failure with no retry left.
        Failed = "failed",
        /// Terminal: the owner withdrew the intent.
        Cancelled = "cancelled",
    }
);

impl JobState {
    /// The terminal states: the job never changes again.
    pub const TERMINAL: &'static [JobState] =
        &[JobState::Succeeded, JobState::Failed, JobState::Cancelled];
    /// The open states: the job may still get an outcome.
    pub const OPEN: &'static [JobState] =
        &[JobState::Pending, JobState::Running, JobState::Unknown];

    /// `succeeded`, `failed` or `cancelled`: the job never changes again.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

label_enum!(
    /// `intent.attempt_state`.
    AttemptState, "attempt_state", {
        /// Handed out by `begin_attempt`; counts as unknown once its deadline passes.
        Started = "started",
        /// The caller's timeout fired or the lease ran out: the provider may still be working.
        Unknown = "unknown",
        /// Its result won and is the job's result.
        Succeeded = "succeeded",
        /// The provider said nothing happened, or the result broke the job's contract.
        Failed = "failed",
        /// Nobody waits for it any more; if it returns, the compare-and-swap decides.
        Abandoned = "abandoned",
        /// It returned after the outcome was decided; its result stays on the attempt.
        Discarded = "discarded",
    }
);

impl AttemptState {
    /// The open states: an attempt in one of them closes the gate (at most one per job).
    pub const OPEN: &'static [AttemptState] = &[AttemptState::Started, AttemptState::Unknown];

    /// `started` or `unknown`: the attempt's outcome is not known yet.
    pub const fn is_open(self) -> bool {
        matches!(self, AttemptState::Started | AttemptState::Unknown)
    }
}

label_enum!(
    /// `intent.completion`: the answer of `complete_attempt`.
    Completion, "completion", {
        /// The compare-and-swap changed the job: this result is the job's result.
        Won = "won",
        /// The outcome was already decided: the result is kept on the attempt only.
        Lost = "lost",
        /// The result broke the job's contract and can never win.
        Rejected = "rejected",
    }
);

label_enum!(
    /// One field of an intent's fingerprint (a column of `intent.jobs`), as an `IJ001`
    /// refusal names it.
    FingerprintField, "fingerprint field", {
        /// The provider differs.
        Provider = "provider",
        /// The params differ (jsonb equality).
        Params = "params",
        /// The contract differs.
        Contract = "contract",
    }
);

label_enum!(
    /// `intent.event_kind`: what an event records.
    EventKind, "event_kind", {
        /// An attempt became unknown: `mark_unknown`, or its lease ran out.
        Timeout = "timeout",
        /// `abandon_attempt`: nobody waits for that attempt any more.
        Abandoned = "abandoned",
        /// `cancel_job`: the owner withdrew the intent.
        Cancelled = "cancelled",
        /// A result lost the compare-and-swap, or came after a definite failure.
        LateResult = "late_result",
        /// A failure arrived after the job's outcome was decided.
        LateFailure = "late_failure",
        /// A result broke the job's contract and was rejected.
        ContractViolation = "contract_violation",
        /// `record_reconciliation` (0.4.0 on): how an attempt whose outcome was unknown was
        /// decided, and on what evidence.
        Reconciled = "reconciled",
    }
);

/// The deadline rule: a `started` attempt whose deadline has passed counts as `unknown`
/// everywhere, swept or not, and its `running` job counts as `unknown` with it. A timeout is
/// unknown, never failed: the provider may still be working.
pub const fn lapsed(state: AttemptState, past_deadline: bool) -> bool {
    matches!(state, AttemptState::Started) && past_deadline
}

/// The deadline rule in SQL, for an attempt row (optionally qualified by an alias): a
/// `started` attempt whose deadline has passed, as of `statement_timestamp()` — one instant per
/// statement. The times a call writes (deadlines among them) are the clock at its write, never
/// earlier than its statement's start, so a statement held open only makes a lease look alive
/// longer to its own calls (docs/protocol.md § Time). Every statement of the extension and every view is built from this fragment (views
/// spell it out, since an install script cannot call a macro; a test checks they match it).
///
/// ```
/// assert_eq!(
///     pg_intent_protocol::lapsed_sql!("a"),
///     "(a.state = 'started' AND a.deadline <= statement_timestamp())"
/// );
/// ```
#[macro_export]
macro_rules! lapsed_sql {
    () => {
        concat!("(state = 'started' AND ", $crate::past_deadline_sql!(), ")")
    };
    ($alias:literal) => {
        concat!(
            "(",
            $alias,
            ".state = 'started' AND ",
            $crate::past_deadline_sql!($alias),
            ")"
        )
    };
}

/// The negation of [`lapsed_sql!`] for a `started` attempt: started and still within its lease.
/// With a second argument, as of that instant instead (a parameter holding the call's clock,
/// for a statement that extends the lease it judges: the heartbeat).
///
/// ```
/// assert_eq!(
///     pg_intent_protocol::live_sql!("a", "$3"),
///     "(a.state = 'started' AND a.deadline > $3)"
/// );
/// ```
#[macro_export]
macro_rules! live_sql {
    ($alias:literal) => {
        concat!(
            "(",
            $alias,
            ".state = 'started' AND ",
            $alias,
            ".deadline > statement_timestamp())"
        )
    };
    ($alias:literal, $now:literal) => {
        concat!(
            "(",
            $alias,
            ".state = 'started' AND ",
            $alias,
            ".deadline > ",
            $now,
            ")"
        )
    };
}

/// The deadline part of [`lapsed_sql!`] alone, for a row whose state was just changed (a
/// `RETURNING` list) or is known to be `started`.
#[macro_export]
macro_rules! past_deadline_sql {
    () => {
        "deadline <= statement_timestamp()"
    };
    ($alias:literal) => {
        concat!($alias, ".deadline <= statement_timestamp()")
    };
}

/// [`AttemptState::OPEN`] as a SQL list, for `state IN …`.
#[macro_export]
macro_rules! open_attempt_states_sql {
    () => {
        "('started', 'unknown')"
    };
}

/// [`JobState::OPEN`] as a SQL list, for `state IN …`.
#[macro_export]
macro_rules! open_job_states_sql {
    () => {
        "('pending', 'running', 'unknown')"
    };
}

/// An attempt's state as the protocol sees it: the deadline rule applied.
pub const fn effective_attempt(state: AttemptState, past_deadline: bool) -> AttemptState {
    if lapsed(state, past_deadline) {
        AttemptState::Unknown
    } else {
        state
    }
}

/// A job's state as the protocol sees it: a `running` job whose open attempt ran out of lease
/// is `unknown`.
pub const fn effective_job(state: JobState, open_attempt_lapsed: bool) -> JobState {
    if matches!(state, JobState::Running) && open_attempt_lapsed {
        JobState::Unknown
    } else {
        state
    }
}

label_enum!(
    /// The calls that move the state machine.
    Call, "call", {
        /// `submit_job`, and each intent of `submit_jobs`.
        SubmitJob = "submit_job",
        /// `begin_attempt`.
        BeginAttempt = "begin_attempt",
        /// `claim_attempts`: `begin_attempt` for each job it takes.
        ClaimAttempts = "claim_attempts",
        /// `complete_attempt`.
        CompleteAttempt = "complete_attempt",
        /// `fail_attempt`.
        FailAttempt = "fail_attempt",
        /// `mark_unknown`.
        MarkUnknown = "mark_unknown",
        /// `heartbeat`: only extends a lease; no transition of its own.
        Heartbeat = "heartbeat",
        /// `sweep`: only applies the deadline rule; no transition of its own.
        Sweep = "sweep",
        /// `abandon_attempt`.
        AbandonAttempt = "abandon_attempt",
        /// `cancel_job`.
        CancelJob = "cancel_job",
    }
);

/// What a transition does to the job's version (its fencing token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// A new job: its first version (1, or one above a purged job's last).
    First,
    /// Unchanged.
    Kept,
    /// Plus one: the outcome slot changed, and every attempt still out there loses.
    Bumped,
}

impl Version {
    /// How the table in `docs/protocol.md` writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Version::First => "first",
            Version::Kept => "=",
            Version::Bumped => "+1",
        }
    }
}

/// One row of the transition table: a call, on an attempt in one of `attempt` (empty: the call
/// concerns no existing attempt) of a job in one of `job` (empty: no job yet), moves them to
/// `to_attempt` and `to_job` (`None`: unchanged), changes the version so, and writes `event`.
/// States are the effective ones (the deadline rule applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The call.
    pub call: Call,
    /// The attempt's state before (any of these).
    pub attempt: &'static [AttemptState],
    /// The job's state before (any of these).
    pub job: &'static [JobState],
    /// The attempt's state after; `None`: unchanged (or no attempt).
    pub to_attempt: Option<AttemptState>,
    /// The job's state after; `None`: unchanged.
    pub to_job: Option<JobState>,
    /// The version change.
    pub version: Version,
    /// The event logged, if any.
    pub event: Option<EventKind>,
    /// When this row applies rather than another with the same call and states.
    pub when: &'static str,
}

use AttemptState as A;
use JobState as J;

const OPEN_JOB: &[JobState] = JobState::OPEN;
const ENDED: &[JobState] = JobState::TERMINAL;
const ANY_JOB: &[JobState] = JobState::ALL;
const STARTED: &[AttemptState] = &[A::Started];
const UNKNOWN: &[AttemptState] = &[A::Unknown];
const ABANDONED: &[AttemptState] = &[A::Abandoned];
const LIVE_OR_ABANDONED: &[AttemptState] = &[A::Started, A::Unknown, A::Abandoned];

// One row per line in the table below: a positional constructor reads as the table does.
#[allow(clippy::too_many_arguments)]
const fn t(
    call: Call,
    attempt: &'static [AttemptState],
    job: &'static [JobState],
    to_attempt: Option<AttemptState>,
    to_job: Option<JobState>,
    version: Version,
    event: Option<EventKind>,
    when: &'static str,
) -> Transition {
    Transition {
        call,
        attempt,
        job,
        to_attempt,
        to_job,
        version,
        event,
        when,
    }
}

/// Every transition of the protocol. A call that meets a `started` attempt past its deadline
/// first persists the deadline rule (the attempt becomes `unknown`, a `running` job too, and a
/// `timeout` event is logged); the rows are written for the states after that. Calls that
/// find nothing to change (a replay, a repeated report, a refusal) are not transitions.
#[rustfmt::skip]
pub const TRANSITIONS: &[Transition] = &[
    t(Call::SubmitJob, &[], &[], None, Some(J::Pending), Version::First, None, "a new (owner_id, idempotency_key)"),
    t(Call::BeginAttempt, &[], &[J::Pending], Some(A::Started), Some(J::Running), Version::Kept, None, "attempts left; the job's provider, or one certified for its contract"),
    t(Call::ClaimAttempts, &[], &[J::Pending], Some(A::Started), Some(J::Running), Version::Kept, None, "attempts left, retry time passed; on the job's own provider"),
    t(Call::CompleteAttempt, STARTED, &[J::Running], Some(A::Succeeded), Some(J::Succeeded), Version::Bumped, None, "won: the compare-and-swap"),
    t(Call::CompleteAttempt, UNKNOWN, &[J::Unknown], Some(A::Succeeded), Some(J::Succeeded), Version::Bumped, None, "won: a late result reconciles the unknown"),
    t(Call::CompleteAttempt, ABANDONED, OPEN_JOB, Some(A::Succeeded), Some(J::Succeeded), Version::Bumped, None, "won: an abandoned attempt came back first"),
    t(Call::CompleteAttempt, LIVE_OR_ABANDONED, ENDED, Some(A::Discarded), None, Version::Kept, Some(EventKind::LateResult), "lost: the outcome was decided"),
    t(Call::CompleteAttempt, &[A::Failed], ANY_JOB, None, None, Version::Kept, Some(EventKind::LateResult), "lost: the attempt had failed definitely (logged once)"),
    t(Call::CompleteAttempt, &[A::Started, A::Unknown, A::Abandoned], &[J::Running, J::Unknown, J::Pending], Some(A::Failed), Some(J::Pending), Version::Kept, Some(EventKind::ContractViolation), "rejected: the result broke the contract; attempts left"),
    t(Call::CompleteAttempt, &[A::Started, A::Unknown, A::Abandoned], OPEN_JOB, Some(A::Failed), Some(J::Failed), Version::Bumped, Some(EventKind::ContractViolation), "rejected, and no attempt left"),
    t(Call::CompleteAttempt, ABANDONED, &[J::Running, J::Unknown], Some(A::Failed), None, Version::Kept, Some(EventKind::ContractViolation), "rejected; another attempt is open and keeps the job"),
    t(Call::CompleteAttempt, LIVE_OR_ABANDONED, ENDED, Some(A::Failed), None, Version::Kept, Some(EventKind::ContractViolation), "rejected after the outcome was decided"),
    t(Call::FailAttempt, &[A::Started, A::Unknown], &[J::Running, J::Unknown], Some(A::Failed), Some(J::Pending), Version::Kept, None, "retryable, attempts left: the gate opens"),
    t(Call::FailAttempt, LIVE_OR_ABANDONED, OPEN_JOB, Some(A::Failed), Some(J::Failed), Version::Bumped, None, "not retryable, or no attempt left (and none other open)"),
    t(Call::FailAttempt, ABANDONED, &[J::Pending, J::Running, J::Unknown], Some(A::Failed), None, Version::Kept, None, "retryable; the open attempt (if any) keeps the job"),
    t(Call::FailAttempt, LIVE_OR_ABANDONED, ENDED, Some(A::Failed), None, Version::Kept, Some(EventKind::LateFailure), "after the outcome was decided"),
    t(Call::FailAttempt, &[A::Succeeded, A::Discarded], ANY_JOB, None, None, Version::Kept, Some(EventKind::LateFailure), "contradicts a recorded result (logged once)"),
    t(Call::MarkUnknown, STARTED, &[J::Running], Some(A::Unknown), Some(J::Unknown), Version::Kept, Some(EventKind::Timeout), "the caller's timeout fired"),
    t(Call::MarkUnknown, STARTED, ENDED, Some(A::Unknown), None, Version::Kept, Some(EventKind::Timeout), "the caller's timeout fired after the outcome was decided"),
    t(Call::AbandonAttempt, STARTED, &[J::Running], Some(A::Abandoned), Some(J::Pending), Version::Kept, Some(EventKind::Abandoned), "the gate opens"),
    t(Call::AbandonAttempt, UNKNOWN, &[J::Unknown], Some(A::Abandoned), Some(J::Pending), Version::Kept, Some(EventKind::Abandoned), "the gate opens"),
    t(Call::AbandonAttempt, &[A::Started, A::Unknown], ENDED, Some(A::Abandoned), None, Version::Kept, Some(EventKind::Abandoned), "after the outcome was decided"),
    t(Call::CancelJob, &[], OPEN_JOB, None, Some(J::Cancelled), Version::Bumped, Some(EventKind::Cancelled), "the owner withdraws the intent; an open attempt stays as it is and loses"),
];

/// One observed change, to be looked up in [`TRANSITIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The call that made it.
    pub call: Call,
    /// The attempt's effective state before; `None`: the call concerned no existing attempt.
    pub attempt: Option<AttemptState>,
    /// The job's effective state before; `None`: there was no job.
    pub job: Option<JobState>,
    /// The attempt's effective state after (`None`: no attempt).
    pub to_attempt: Option<AttemptState>,
    /// The job's effective state after.
    pub to_job: JobState,
    /// The version change.
    pub version: Version,
    /// The event logged (besides a `timeout` persisting the deadline rule), if any.
    pub event: Option<EventKind>,
}

impl Transition {
    /// Whether this row allows the observed change.
    pub fn allows(&self, o: &Observed) -> bool {
        let attempt_ok = match o.attempt {
            None => self.attempt.is_empty(),
            Some(a) => self.attempt.contains(&a),
        };
        let job_ok = match o.job {
            None => self.job.is_empty(),
            Some(j) => self.job.contains(&j),
        };
        let to_attempt = self.to_attempt.or(o.attempt);
        let to_job = self.to_job.or(o.job);
        self.call == o.call
            && attempt_ok
            && job_ok
            && to_attempt == o.to_attempt
            && to_job == Some(o.to_job)
            && self.version == o.version
            && self.event == o.event
    }
}

/// The row of [`TRANSITIONS`] that allows an observed change, if any.
pub fn find_transition(o: &Observed) -> Option<&'static Transition> {
    TRANSITIONS.iter().find(|t| t.allows(o))
}

fn states<T: fmt::Display>(set: &[T], all: &[T], none: &str) -> String {
    if set.is_empty() {
        return none.to_string();
    }
    if set.len() == all.len() && all.len() > 1 {
        return "any".to_string();
    }
    set.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`TRANSITIONS`] as the Markdown table `docs/protocol.md` carries.
pub fn transitions_markdown() -> String {
    let mut out = String::from(
        "| call | attempt | job | → attempt | → job | version | event | when |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for t in TRANSITIONS {
        let to = |s: Option<String>| s.unwrap_or_else(|| "=".to_string());
        let to_attempt = match (t.attempt.is_empty(), t.to_attempt) {
            (true, None) => "—".to_string(),
            (_, a) => to(a.map(|s| s.to_string())),
        };
        out += &format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            t.call,
            match (t.attempt.is_empty(), t.to_attempt.is_some()) {
                (true, true) => "(new)".to_string(),
                (true, false) => "—".to_string(),
                _ => states(t.attempt, AttemptState::ALL, ""),
            },
            states(t.job, JobState::ALL, "(none)"),
            to_attempt,
            to(t.to_job.map(|s| s.to_string())),
            t.version.as_str(),
            t.event.map_or("—".to_string(), |e| format!("`{e}`")),
            t.when,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), *s);
        }
        for s in AttemptState::ALL {
            assert_eq!(s.as_str().parse::<AttemptState>().unwrap(), *s);
        }
        assert!("paused".parse::<JobState>().is_err());
        assert_eq!(
            JobState::ALL.iter().filter(|s| s.is_terminal()).count(),
            JobState::TERMINAL.len()
        );
        assert_eq!(
            AttemptState::ALL.iter().filter(|s| s.is_open()).count(),
            AttemptState::OPEN.len()
        );
    }

    #[test]
    fn the_deadline_rule() {
        assert!(lapsed(AttemptState::Started, true));
        assert!(!lapsed(AttemptState::Started, false));
        assert!(!lapsed(AttemptState::Abandoned, true));
        assert_eq!(
            effective_attempt(AttemptState::Started, true),
            AttemptState::Unknown
        );
        assert_eq!(effective_job(JobState::Running, true), JobState::Unknown);
        assert_eq!(
            effective_job(JobState::Cancelled, true),
            JobState::Cancelled
        );
    }

    #[test]
    fn every_deadline_comparison_is_the_fragment() {
        // The views spell the fragment out; the extension's statements use the macros. Any other
        // comparison with a deadline is a second statement of the rule, which this refuses.
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let lapsed = lapsed_sql!("a");
        let core = &lapsed[1..lapsed.len() - 1];
        let mut files: Vec<std::path::PathBuf> = Vec::new();
        for dir in ["sql", "extension/src"] {
            for entry in std::fs::read_dir(format!("{root}/{dir}")).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "sql" || e == "rs") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 10, "{files:?}");
        let mut uses = 0;
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("--").next().unwrap().split("//").next().unwrap();
                for op in [
                    "deadline <= statement_timestamp()",
                    "deadline < statement_timestamp()",
                    "deadline > statement_timestamp()",
                    "deadline >= statement_timestamp()",
                    "statement_timestamp() >",
                    "statement_timestamp() <",
                ] {
                    if code.contains(op) {
                        assert!(
                            code.contains(core) || code.contains(&core.replace("a.", "")),
                            "{}:{}: a deadline comparison that is not lapsed_sql!: {line}",
                            path.display(),
                            n + 1
                        );
                        uses += 1;
                    }
                }
            }
        }
        assert!(uses >= 2, "the views use the fragment");
    }

    #[test]
    fn the_sql_sets_are_the_state_sets() {
        fn list<T: fmt::Display>(set: &[T]) -> String {
            let labels: Vec<String> = set.iter().map(|s| format!("'{s}'")).collect();
            format!("({})", labels.join(", "))
        }
        assert_eq!(open_attempt_states_sql!(), list(AttemptState::OPEN));
        assert_eq!(open_job_states_sql!(), list(JobState::OPEN));
    }

    #[test]
    fn terminal_jobs_never_change_state() {
        for t in TRANSITIONS {
            if t.job.iter().all(|j| j.is_terminal()) && !t.job.is_empty() {
                assert_eq!(t.to_job, None, "{t:?}");
                assert_eq!(t.version, Version::Kept, "{t:?}");
            }
        }
    }

    #[test]
    fn only_an_outcome_moves_the_version() {
        for t in TRANSITIONS {
            let outcome = matches!(
                t.to_job,
                Some(JobState::Succeeded | JobState::Failed | JobState::Cancelled)
            );
            assert_eq!(outcome, t.version == Version::Bumped, "{t:?}");
        }
    }

    #[test]
    fn the_table_in_the_docs_is_this_one() {
        let doc = include_str!("../../docs/protocol.md");
        assert!(
            doc.contains(&transitions_markdown()),
            "docs/protocol.md does not carry TRANSITIONS; it should contain:\n{}",
            transitions_markdown()
        );
    }
}

//! Where the calls run: the [`Executor`] trait, and the per-connection statement cache.
//!
//! See the crate documentation, "Connections, transactions and pools".

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use tokio::sync::OnceCell;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, Statement};

/// Declares the statement registry once: each call with its documentation, its SQL text and the
/// types it is prepared with. From this one table come [`Call`], [`Call::ALL`] (in the order of
/// the cache slots), [`Call::sql`] and [`Call::param_types`]: a new call is one entry here (and
/// its function in `calls.rs`).
macro_rules! calls {
    ($(
        $(#[doc = $doc:expr])*
        $call:ident => $sql:expr, [$($ty:ident),* $(,)?];
    )*) => {
        /// One of the SQL statements this crate runs: one per SQL function of the API
        /// (docs/reference.md § 1), plus the table reads of the reconciler helpers.
        ///
        /// Exposed so that [`Executor`] can be implemented for other connection types (another
        /// pool, a wrapper of your own): prepare [`Call::sql`] with [`Call::param_types`] once
        /// per connection and hand the same [`Statement`] back every time.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Call {
            $($(#[doc = $doc])* $call,)*
        }

        impl Call {
            /// Every call, in the order of their cache slots.
            pub const ALL: [Call; [$(stringify!($call)),*].len()] = [$(Call::$call),*];

            /// The SQL text. Enum results are cast to `text` so that preparing needs no look-up
            /// of the extension's types.
            pub fn sql(self) -> &'static str {
                match self {
                    $(Call::$call => $sql,)*
                }
            }

            /// The parameter types the statement is prepared with (so no parameter is left to
            /// inference).
            pub fn param_types(self) -> &'static [Type] {
                match self {
                    $(Call::$call => &[$(Type::$ty),*],)*
                }
            }
        }
    };
}

/// The start of the `intent.attempts` reads: the columns [`crate::AttemptRecord`] is read from.
macro_rules! select_attempts {
    () => {
        "SELECT id, job_id, attempt_no, provider, state::text, version_read, worker, lease, \
         started_at, deadline, finished_at, result, error FROM intent.attempts "
    };
}

calls! {
    /// `intent.submit_job`.
    SubmitJob => "SELECT job_id, created, state::text, version, result \
                  FROM intent.submit_job($1, $2, $3, $4, $5, $6)",
        [TEXT, TEXT, TEXT, JSONB, TEXT, INT4];
    /// `intent.begin_attempt`.
    BeginAttempt => "SELECT attempt_id, attempt_no, version, deadline \
                     FROM intent.begin_attempt($1, $2, $3, $4)",
        [UUID, TEXT, INTERVAL, TEXT];
    /// `intent.complete_attempt`.
    CompleteAttempt => "SELECT intent.complete_attempt($1, $2, $3)::text", [UUID, INT8, JSONB];
    /// `intent.fail_attempt`.
    FailAttempt => "SELECT intent.fail_attempt($1, $2, $3, $4, $5)::text",
        [UUID, INT8, JSONB, BOOL, INTERVAL];
    /// `intent.mark_unknown`.
    MarkUnknown => "SELECT intent.mark_unknown($1, $2)", [UUID, TEXT];
    /// `intent.heartbeat`.
    Heartbeat => "SELECT intent.heartbeat($1, $2)", [UUID, INTERVAL];
    /// `intent.abandon_attempt`.
    AbandonAttempt => "SELECT intent.abandon_attempt($1, $2)", [UUID, TEXT];
    /// `intent.cancel_job`.
    CancelJob => "SELECT intent.cancel_job($1, $2)", [UUID, TEXT];
    /// `intent.sweep`.
    Sweep => "SELECT intent.sweep()", [];
    /// `intent.purge`.
    Purge => "SELECT intent.purge($1, $2)", [INTERVAL, INT4];
    /// `intent.purge_expired` (pg_intent 0.5.0 on).
    PurgeExpired => "SELECT intent.purge_expired($1)", [INT4];
    // Through the view, which loads the library first (SHOW would fail in a session that has
    // not loaded it yet); seconds, computed on the server; NULL for 'never'.
    /// The retention, `intent.retention` (pg_intent 0.5.0 on: the view `intent.settings`).
    Retention => "SELECT CASE WHEN lower(btrim(setting)) = 'never' THEN NULL \
                  ELSE extract(epoch FROM setting::interval)::float8 END \
                  FROM intent.settings WHERE name = 'intent.retention'",
        [];
    /// Reads one row of `intent.jobs`.
    GetJob => "SELECT id, owner_id, idempotency_key, provider, params, contract, state::text, \
               version, completed_by, result, error, max_attempts, attempt_count, created_at, \
               updated_at FROM intent.jobs WHERE id = $1",
        [UUID];
    /// Reads one row of `intent.attempts`.
    GetAttempt => concat!(select_attempts!(), "WHERE id = $1"), [UUID];
    /// Reads the `unknown` rows of `intent.attempts`, oldest first.
    UnknownAttempts => concat!(
            select_attempts!(),
            "WHERE state = 'unknown' ORDER BY started_at, id LIMIT $1"
        ),
        [INT8];
    // The checker is named by its signature; an unknown one is an error (42883), never
    // silently no checker.
    /// `intent.define_contract`.
    DefineContract => "SELECT intent.define_contract($1, $2, $3::regprocedure)",
        [TEXT, JSONB, TEXT];
    /// `intent.certify_provider`.
    CertifyProvider => "SELECT intent.certify_provider($1, $2, $3, $4)",
        [TEXT, TEXT, JSONB, INTERVAL];
    /// `intent.revoke_certification`.
    RevokeCertification => "SELECT intent.revoke_certification($1, $2, $3)", [TEXT, TEXT, TEXT];
    // intent.bound_owner() first: it loads pg_intent's library, so that the setting is
    // pg_intent's own (which RESET ALL leaves alone) and not a placeholder for it.
    /// Binds the transaction to one owner (`set_config('intent.owner_id', …, true)`).
    BindOwner => "SELECT intent.bound_owner() IS NULL, \
                  pg_catalog.set_config('intent.owner_id', $1, true)",
        [TEXT];
    /// `intent.validate_result`.
    ValidateResult => "SELECT valid, errors FROM intent.validate_result($1, $2)", [TEXT, JSONB];
    /// `intent.claim_attempts`.
    ClaimAttempts => "SELECT job_id, attempt_id, attempt_no, version, deadline, provider, params, \
                      contract FROM intent.claim_attempts($1, $2, $3, $4)",
        [TEXT_ARRAY, TEXT, INTERVAL, INT4];
    // The pending jobs with attempts left whose retry time lies ahead, by the
    // `jobs_claimable_since` index (0.5.0 on; a job claimable now, or with no retry time on an
    // older catalog, is not ahead); computed on the server so that clock skew does not matter.
    /// How long until the next retry time of a claimable job (reads `intent.jobs`).
    // Every operator schema-qualified: a worker's search_path may hold a schema a tenant can
    // write to, where an operator of a better match would be chosen over pg_catalog's.
    NextRetryIn => "SELECT extract(epoch FROM min(retry_at) OPERATOR(pg_catalog.-) \
                    pg_catalog.statement_timestamp())::float8 \
                    FROM intent.jobs \
                    WHERE retry_at OPERATOR(pg_catalog.>) pg_catalog.statement_timestamp() \
                    AND state OPERATOR(pg_catalog.=) 'pending'::intent.job_state \
                    AND attempt_count OPERATOR(pg_catalog.<) max_attempts \
                    AND ($1::text[] IS NULL OR provider OPERATOR(pg_catalog.=) ANY ($1::text[]))",
        [TEXT_ARRAY];
    /// `intent.record_reconciliation` (pg_intent 0.4.0 on).
    RecordReconciliation => "SELECT intent.record_reconciliation($1, $2, $3)",
        [UUID, TEXT, JSONB];
}

impl Call {
    fn slot(self) -> usize {
        self as usize
    }
}

/// Anything that can run pg_intent's calls: it names the [`Client`] (the connection) to run on,
/// and prepares each [`Call`] at most once per connection.
///
/// Implemented for [`Connection`], [`Transaction`], [`Cached`] and, with the `deadpool` feature,
/// for `deadpool_postgres::Object`, `deadpool_postgres::ClientWrapper` and
/// `deadpool_postgres::Transaction`; also for `&E` and `Arc<E>` of any of them.
///
/// A query run on [`Executor::client`] of a transaction runs inside that transaction: a
/// tokio-postgres transaction is state of the connection, not a separate channel.
pub trait Executor: Send + Sync {
    /// The client whose connection runs the query.
    fn client(&self) -> &Client;

    /// The prepared statement for `call` on this connection, prepared on first use only.
    fn prepare_call(
        &self,
        call: Call,
    ) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send;
}

impl<E: Executor + ?Sized> Executor for &E {
    fn client(&self) -> &Client {
        (**self).client()
    }

    fn prepare_call(
        &self,
        call: Call,
    ) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send {
        (**self).prepare_call(call)
    }
}

impl<E: Executor + ?Sized> Executor for Arc<E> {
    fn client(&self) -> &Client {
        (**self).client()
    }

    fn prepare_call(
        &self,
        call: Call,
    ) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send {
        (**self).prepare_call(call)
    }
}

/// The prepared statements of one connection: one lazily filled slot per [`Call`].
///
/// It must only ever be used with the connection it was first used with. [`Connection`] keeps
/// its own; a standalone one is for [`StatementCache::on`]. Used with another connection by
/// mistake, a call fails with SQLSTATE `26000` (`prepared statement "sN" does not exist`, as
/// tokio-postgres names statements uniquely within a process): it never runs another statement.
#[derive(Debug, Default)]
pub struct StatementCache {
    slots: [OnceCell<Statement>; Call::ALL.len()],
}

impl StatementCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The statement for `call`, preparing it on `client` the first time. Concurrent first uses
    /// share one preparation.
    pub async fn get(
        &self,
        client: &Client,
        call: Call,
    ) -> Result<Statement, tokio_postgres::Error> {
        self.slots[call.slot()]
            .get_or_try_init(|| client.prepare_typed(call.sql(), call.param_types()))
            .await
            .cloned()
    }

    /// How many statements are prepared.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.initialized()).count()
    }

    /// Whether no statement is prepared yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pairs this cache with a bare tokio-postgres [`Client`] or [`tokio_postgres::Transaction`]
    /// of the connection it belongs to.
    pub fn on<'a, C>(&'a self, conn: &'a C) -> Cached<'a, C>
    where
        C: tokio_postgres::GenericClient + Sync,
    {
        Cached { conn, cache: self }
    }
}

/// A bare tokio-postgres client or transaction paired with the [`StatementCache`] of its
/// connection (see [`StatementCache::on`]).
#[derive(Debug)]
pub struct Cached<'a, C> {
    conn: &'a C,
    cache: &'a StatementCache,
}

impl<C> Clone for Cached<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Cached<'_, C> {}

impl<C: tokio_postgres::GenericClient + Sync> Executor for Cached<'_, C> {
    fn client(&self) -> &Client {
        self.conn.client()
    }

    async fn prepare_call(&self, call: Call) -> Result<Statement, tokio_postgres::Error> {
        self.cache.get(self.conn.client(), call).await
    }
}

/// A [`tokio_postgres::Client`] together with the statement cache of its connection.
///
/// Dereferences to the client, so everything else you do with it stays as it was.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let (client, conn) = tokio_postgres::connect("host=localhost user=app", tokio_postgres::NoTls).await?;
/// tokio::spawn(conn);
/// let db = pg_intent_client::Connection::new(client);
/// let swept = pg_intent_client::sweep(&db).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Connection {
    client: Client,
    cache: StatementCache,
}

impl Connection {
    /// Wraps a client; nothing is prepared until the first call.
    pub fn new(client: Client) -> Self {
        Connection {
            client,
            cache: StatementCache::new(),
        }
    }

    /// The client back, dropping its prepared statements.
    pub fn into_inner(self) -> Client {
        self.client
    }

    /// The statement cache of this connection.
    pub fn statements(&self) -> &StatementCache {
        &self.cache
    }

    /// The client, to begin a transaction on, beside the statement cache.
    pub(crate) fn parts_mut(&mut self) -> (&mut Client, &StatementCache) {
        (&mut self.client, &self.cache)
    }

    /// Begins a transaction (`BEGIN`) that shares this connection's statements.
    ///
    /// Calls made with it run inside it: a job submitted there becomes visible only when the
    /// transaction commits, together with the business write that needs it.
    pub async fn transaction(&mut self) -> Result<Transaction<'_>, tokio_postgres::Error> {
        Ok(Transaction {
            tx: self.client.transaction().await?,
            cache: &self.cache,
        })
    }

    /// Begins a transaction with an isolation level (docs/protocol.md § Concurrency: under `REPEATABLE
    /// READ` or `SERIALIZABLE` a concurrent change may surface as `40001`; retry the transaction).
    pub async fn transaction_with(
        &mut self,
        isolation: IsolationLevel,
    ) -> Result<Transaction<'_>, tokio_postgres::Error> {
        Ok(Transaction {
            tx: self
                .client
                .build_transaction()
                .isolation_level(isolation)
                .start()
                .await?,
            cache: &self.cache,
        })
    }
}

impl From<Client> for Connection {
    fn from(client: Client) -> Self {
        Connection::new(client)
    }
}

impl Deref for Connection {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

impl Executor for Connection {
    fn client(&self) -> &Client {
        &self.client
    }

    async fn prepare_call(&self, call: Call) -> Result<Statement, tokio_postgres::Error> {
        self.cache.get(&self.client, call).await
    }
}

/// A [`tokio_postgres::Transaction`] of a [`Connection`], sharing its statements.
///
/// Dereferences to the tokio-postgres transaction for your own queries. Dropped without
/// [`Transaction::commit`], it rolls back.
pub struct Transaction<'a> {
    tx: tokio_postgres::Transaction<'a>,
    cache: &'a StatementCache,
}

impl std::fmt::Debug for Transaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction").finish_non_exhaustive()
    }
}

impl<'a> Transaction<'a> {
    /// Commits the transaction.
    pub async fn commit(self) -> Result<(), tokio_postgres::Error> {
        self.tx.commit().await
    }

    /// Rolls the transaction back.
    pub async fn rollback(self) -> Result<(), tokio_postgres::Error> {
        self.tx.rollback().await
    }

    /// A nested transaction (a savepoint) sharing the same statements.
    pub async fn transaction(&mut self) -> Result<Transaction<'_>, tokio_postgres::Error> {
        Ok(Transaction {
            tx: self.tx.transaction().await?,
            cache: self.cache,
        })
    }

    /// The tokio-postgres transaction.
    pub fn into_inner(self) -> tokio_postgres::Transaction<'a> {
        self.tx
    }
}

impl<'a> Deref for Transaction<'a> {
    type Target = tokio_postgres::Transaction<'a>;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl Executor for Transaction<'_> {
    fn client(&self) -> &Client {
        self.tx.client()
    }

    async fn prepare_call(&self, call: Call) -> Result<Statement, tokio_postgres::Error> {
        self.cache.get(self.tx.client(), call).await
    }
}

mod sealed {
    pub trait Sealed {}
}

/// An [`Executor`] that is a transaction: a [`Transaction`] (or a savepoint of one), a
/// `deadpool_postgres::Transaction` (feature `deadpool`), or a bare
/// `tokio_postgres::Transaction` with its [`StatementCache`] ([`StatementCache::on`]).
///
/// What [`crate::bind_owner`] takes, so that binding a plain connection — where `SET LOCAL`
/// lasts one statement and the next query runs unbound — does not compile. It cannot be
/// implemented outside this crate.
pub trait InTransaction: Executor + sealed::Sealed {}

impl sealed::Sealed for Transaction<'_> {}
impl InTransaction for Transaction<'_> {}

impl sealed::Sealed for Cached<'_, tokio_postgres::Transaction<'_>> {}
impl InTransaction for Cached<'_, tokio_postgres::Transaction<'_>> {}

impl<T: InTransaction + ?Sized> sealed::Sealed for &T {}
impl<T: InTransaction + ?Sized> InTransaction for &T {}

/// Any error, as events carry them: a pool's, or the client's own [`Error`](crate::Error) (downcast
/// it).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a [`crate::Runner`] gets the connections its claims and attempts run on.
///
/// Implemented for a `deadpool_postgres::Pool` (feature `deadpool`; give it at least the
/// runner's concurrency plus one connection: each running attempt holds one for its heartbeats
/// and report) and for an `Arc` of any [`Executor`] (one connection shared by everything: the
/// queries of all attempts are pipelined on it). The connections must not be inside a
/// transaction.
pub trait Connections: Send + Sync + 'static {
    /// A connection.
    type Conn: Executor + Send + Sync + 'static;

    /// A connection to run one claim, or one attempt, on.
    fn connection(&self) -> impl Future<Output = Result<Self::Conn, BoxError>> + Send;
}

impl<E: Executor + 'static> Connections for Arc<E> {
    type Conn = Arc<E>;

    async fn connection(&self) -> Result<Arc<E>, BoxError> {
        Ok(self.clone())
    }
}

/// A new connection each time (without TLS), its connection task spawned on the runtime.
impl Connections for tokio_postgres::Config {
    type Conn = Connection;

    async fn connection(&self) -> Result<Connection, BoxError> {
        let (client, conn) = self.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        Ok(Connection::new(client))
    }
}

#[cfg(feature = "deadpool")]
impl Connections for deadpool_postgres::Pool {
    type Conn = deadpool_postgres::Object;

    async fn connection(&self) -> Result<deadpool_postgres::Object, BoxError> {
        Ok(self.get().await?)
    }
}

#[cfg(feature = "deadpool")]
impl sealed::Sealed for deadpool_postgres::Transaction<'_> {}
#[cfg(feature = "deadpool")]
impl InTransaction for deadpool_postgres::Transaction<'_> {}

#[cfg(feature = "deadpool")]
mod pooled {
    //! deadpool-postgres keeps a statement cache in every pooled connection; use it.

    use super::{Call, Executor};
    use tokio_postgres::{Client, Statement};

    impl Executor for deadpool_postgres::ClientWrapper {
        fn client(&self) -> &Client {
            self
        }

        async fn prepare_call(&self, call: Call) -> Result<Statement, tokio_postgres::Error> {
            self.prepare_typed_cached(call.sql(), call.param_types())
                .await
        }
    }

    impl Executor for deadpool_postgres::Object {
        fn client(&self) -> &Client {
            self
        }

        async fn prepare_call(&self, call: Call) -> Result<Statement, tokio_postgres::Error> {
            self.prepare_typed_cached(call.sql(), call.param_types())
                .await
        }
    }

    impl Executor for deadpool_postgres::Transaction<'_> {
        fn client(&self) -> &Client {
            (**self).client()
        }

        async fn prepare_call(&self, call: Call) -> Result<Statement, tokio_postgres::Error> {
            self.prepare_typed_cached(call.sql(), call.param_types())
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_has_a_slot_and_its_params() {
        for (i, call) in Call::ALL.iter().enumerate() {
            assert_eq!(call.slot(), i);
            let placeholders = (1..=call.param_types().len())
                .filter(|n| call.sql().contains(&format!("${n}")))
                .count();
            assert_eq!(placeholders, call.param_types().len(), "{call:?}");
            assert!(
                !call
                    .sql()
                    .contains(&format!("${}", call.param_types().len() + 1))
            );
        }
    }
}

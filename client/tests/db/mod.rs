//! What the client's tests add to the test-cluster harness (pg_intent_cluster, shared with the
//! integration tests and the gateway's): a fresh database with the extension on this test
//! binary's cluster, and a `pg_intent_client::Connection` to it. (The harness's tests include
//! this file too: `harness/tests/db/`.)
#![allow(dead_code)]

use std::ops::Deref;

use pg_intent_client::Connection;
pub use pg_intent_cluster::{Cluster, Db};

/// A fresh database with `pg_intent` on the cluster of this test binary (its name, cluster and
/// connection strings are the [`Db`]'s).
pub struct TestDb(Db<'static>);

impl TestDb {
    /// A new database with `pg_intent` installed, on [`Cluster::shared_fast`] (started on
    /// first use, stopped when the test process exits).
    pub async fn new() -> TestDb {
        let cluster = tokio::task::spawn_blocking(Cluster::shared_fast)
            .await
            .expect("start the test cluster");
        TestDb(cluster.fresh_db_copied("client").await)
    }

    /// A bare tokio-postgres client.
    pub async fn client(&self) -> tokio_postgres::Client {
        self.0.connect().await
    }

    /// A client wrapped with its statement cache.
    pub async fn conn(&self) -> Connection {
        Connection::new(self.client().await)
    }
}

impl Deref for TestDb {
    type Target = Db<'static>;

    fn deref(&self) -> &Db<'static> {
        &self.0
    }
}

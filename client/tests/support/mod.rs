//! What the client's tests add to the test-cluster harness (pg_intent_cluster, shared with the
//! integration tests and the gateway's): a fresh database with the extension on this test
//! binary's cluster, and a `pg_intent_client::Connection` to it.
#![allow(dead_code)]

use pg_intent_client::Connection;
pub use pg_intent_cluster::{Cluster, Db};

/// A fresh database with `pg_intent` on the cluster of this test binary.
pub type TestDb = Db<'static>;

/// A new database with `pg_intent` installed, on [`Cluster::shared_fast`] (started on first
/// use, stopped when the test process exits).
pub async fn fresh_db() -> TestDb {
    let cluster = tokio::task::spawn_blocking(Cluster::shared_fast)
        .await
        .expect("start the test cluster");
    cluster.fresh_db_copied("client").await
}

/// A connection wrapped with the client's statement cache.
#[allow(async_fn_in_trait)]
pub trait Conn {
    async fn conn(&self) -> Connection;
}

impl Conn for Db<'_> {
    async fn conn(&self) -> Connection {
        Connection::new(self.connect().await)
    }
}

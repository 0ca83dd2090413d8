//! The gateway's tests run on the test-cluster harness every crate's tests share
//! (pg_intent_cluster), plus the gateway's database role.
#![allow(dead_code)]

pub use pg_intent_cluster::{Cluster, Db, eventually};
use tokio::sync::OnceCell;

/// A fresh database with `pg_intent` on the cluster of this test binary.
pub type TestDb = Db<'static>;

/// A fresh database with the extension, and the `gateway` role the gateway connects as, as
/// README § Privileges describes it: it reads jobs (GET, the worker) and binds each request to
/// its owner. Roles and parameter grants are cluster-wide, so they are created once per cluster.
pub async fn gateway_db() -> TestDb {
    static ROLE: OnceCell<()> = OnceCell::const_new();
    let cluster = tokio::task::spawn_blocking(Cluster::shared_fast)
        .await
        .expect("start the test cluster");
    let db = cluster.fresh_db_copied("gateway").await;
    ROLE.get_or_init(|| async {
        db.connect()
            .await
            .batch_execute(
                "CREATE ROLE gateway LOGIN IN ROLE intent_operator;
                 GRANT SET ON PARAMETER intent.owner_id TO gateway;",
            )
            .await
            .expect("CREATE ROLE gateway");
    })
    .await;
    db
}

//! The gateway's tests run on the client's throwaway-cluster harness
//! (client/tests/common/mod.rs), plus the gateway's database role.
#![allow(dead_code)]

#[path = "../../../client/tests/common/mod.rs"]
mod client_harness;

pub use client_harness::*;
use tokio::sync::OnceCell;

/// A fresh database with the extension, and the `gateway` role the gateway connects as, as
/// README § Privileges describes it: it reads jobs (GET, the worker) and binds each request to
/// its owner. Roles and parameter grants are cluster-wide, so they are created once per cluster.
pub async fn gateway_db() -> TestDb {
    static ROLE: OnceCell<()> = OnceCell::const_new();
    let db = TestDb::new().await;
    ROLE.get_or_init(|| async {
        db.client()
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

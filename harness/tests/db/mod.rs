//! What the harness's tests add to the client's test databases (`client/tests/db/`, included
//! here as it is): the captions contract of the test provider, defined as an administrator
//! defines it.
#![allow(dead_code)]

#[path = "../../../client/tests/db/mod.rs"]
mod client_db;

pub use client_db::*;

/// The captions contract (test provider fixture): its checker, then the contract, as an
/// administrator defines them.
pub async fn define_captions(db: &pg_intent_client::Connection) {
    use pg_intent_test_provider::captions;
    db.batch_execute(captions::CHECKER_SQL).await.unwrap();
    pg_intent_client::define_contract(
        db,
        captions::CONTRACT,
        &captions::schema(),
        Some(captions::CHECKER),
    )
    .await
    .unwrap();
}

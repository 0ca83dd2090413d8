//! The idempotency key a provider sees for an attempt, and the one a reconciler asks it about.
//!
//! # Why not the attempt id
//!
//! Attempt ids are derived from the owner and the job's idempotency key (`id/`), so anyone who
//! knows or guesses those computes them. A provider keeps requests by idempotency key **per
//! provider account**. Parties that share an account (tenants of one gateway sending their own
//! requests with the same API key, teams of one organisation) could therefore send a request
//! under *another owner's* attempt id before that attempt's worker does, with their own prompt:
//! the provider then holds a finished request under that key, with their output, and a
//! [`crate::Reconciler`] asking "what became of K?" completes the other owner's attempt with it
//! (and the worker's own request is answered from the planted one, by the provider's
//! idempotency).
//!
//! # The keyed derivation
//!
//! With a secret ([`ProviderKeys::keyed`], or [`SECRET_ENV`] through
//! [`ProviderKeys::from_env`]) the key is `pgik1-` followed by the hex of
//! HMAC-SHA256(secret, `"pg_intent provider idempotency key v1\0" || attempt id`): 70
//! characters, unpredictable to anyone without the secret, so nobody can send a request under it
//! before the worker does. Give the same secret to every process that calls the providers for
//! attempts (the workers: `pg_intent_harness::ContractSuite::provider_keys`) and to every
//! reconciler (`pg_intent_harness::RequestLookup` takes the suite's, or
//! `pg_intent_harness::RequestLookup::provider_keys`); never to a party that shares the provider
//! account. Rotating it is a cut-over like turning it on ([`ProviderKeys::raw_before`] shows
//! the pattern: only one earlier derivation is accepted, the raw id).
//!
//! # Without a secret (the default)
//!
//! [`ProviderKeys::attempt_id`]: the key is the attempt id, as before pg_intent 0.4.1. This is
//! the default **for backward compatibility**: attempts in flight were sent under their ids, and
//! a reconciler that asked under another key would hear "never received" and fail them as
//! retryable, so the work would be done twice. It is safe only when nobody else can send
//! requests on the provider account. Turning a secret on: set it on the workers and the
//! reconcilers together, with [`ProviderKeys::raw_before`] set to the moment of the switch, so
//! that the attempts begun before it are still asked about under their ids (those, and only
//! those, keep the old exposure until they are decided).

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::records::AttemptRecord;

/// The environment variable [`ProviderKeys::from_env`] reads the secret from.
pub const SECRET_ENV: &str = "PG_INTENT_PROVIDER_KEY_SECRET";

/// The prefix of a keyed provider key (the derivation's version).
pub const KEYED_PREFIX: &str = "pgik1-";

/// What a keyed derivation hashes before the attempt id: the purpose and its version, so that
/// the secret is never used for anything else by accident.
const DOMAIN: &[u8] = b"pg_intent provider idempotency key v1\0";

/// How an attempt's provider idempotency key is derived (see the [module](self) documentation).
#[derive(Clone, Default)]
pub struct ProviderKeys {
    secret: Option<Arc<[u8]>>,
    raw_before: Option<SystemTime>,
}

impl fmt::Debug for ProviderKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderKeys")
            .field("keyed", &self.secret.is_some())
            .field("raw_before", &self.raw_before)
            .finish()
    }
}

impl ProviderKeys {
    /// The attempt id itself (the default; pg_intent before 0.4.1): safe only when nobody else
    /// can send requests on the provider account.
    pub fn attempt_id() -> Self {
        ProviderKeys::default()
    }

    /// HMAC-SHA256 of the attempt id under `secret` (at least 16 bytes; 32 random bytes are
    /// right).
    ///
    /// # Panics
    ///
    /// If `secret` is shorter than 16 bytes: a short secret is guessed.
    pub fn keyed(secret: impl AsRef<[u8]>) -> Self {
        let secret = secret.as_ref();
        assert!(
            secret.len() >= 16,
            "a provider key secret must have at least 16 bytes"
        );
        ProviderKeys {
            secret: Some(secret.into()),
            raw_before: None,
        }
    }

    /// From [`SECRET_ENV`]: keyed with its value when it is set, the attempt id when it is not.
    /// An `Err` when it is set but shorter than 16 bytes.
    ///
    /// Unset is not an error, and the two cannot be told apart by their keys' use alone: a
    /// reconciler started without the secret while the workers have it asks under raw attempt
    /// ids, hears "never received" for every keyed request, and fails those attempts as
    /// retryable — the work done twice. So the choice is logged (`log` target
    /// `pg_intent_client`, a warning when unset); check [`ProviderKeys::is_keyed`] at start-up
    /// wherever the workers are keyed, and set the secret on every worker and reconciler at
    /// once (with [`ProviderKeys::raw_before`] on the reconcilers for the attempts sent before).
    pub fn from_env() -> Result<Self, String> {
        match std::env::var_os(SECRET_ENV) {
            None => {
                log::warn!(
                    target: "pg_intent_client",
                    "{SECRET_ENV} is not set: provider keys are the raw attempt ids (a reconciler \
                     must use the same keys as the workers)"
                );
                Ok(ProviderKeys::attempt_id())
            }
            Some(v) => {
                let v = v.into_encoded_bytes();
                if v.len() < 16 {
                    return Err(format!(
                        "{SECRET_ENV} is set but has {} bytes: at least 16 are needed",
                        v.len()
                    ));
                }
                log::info!(
                    target: "pg_intent_client",
                    "{SECRET_ENV} is set: provider keys are keyed (pgik1-)"
                );
                Ok(ProviderKeys::keyed(v))
            }
        }
    }

    /// The cut-over to a secret: attempts that **started** before `at` (by the database's
    /// clock) are asked about under their ids, as they were sent. Lookups only; what a worker
    /// sends is always [`ProviderKeys::key_for`].
    pub fn raw_before(mut self, at: SystemTime) -> Self {
        self.raw_before = Some(at);
        self
    }

    /// Whether keys are derived with a secret.
    pub fn is_keyed(&self) -> bool {
        self.secret.is_some()
    }

    /// The idempotency key a worker sends the provider for `attempt_id`.
    pub fn key_for(&self, attempt_id: Uuid) -> String {
        match &self.secret {
            None => attempt_id.to_string(),
            Some(secret) => {
                let mut message = DOMAIN.to_vec();
                message.extend_from_slice(attempt_id.to_string().as_bytes());
                let mac = hmac_sha256(secret, &message);
                let mut key = String::with_capacity(KEYED_PREFIX.len() + 64);
                key.push_str(KEYED_PREFIX);
                for b in mac {
                    key.push_str(&format!("{b:02x}"));
                }
                key
            }
        }
    }

    /// The key a reconciler asks the provider about for `attempt`: [`ProviderKeys::key_for`],
    /// or its id when it started before [`ProviderKeys::raw_before`].
    pub fn lookup_key(&self, attempt: &AttemptRecord) -> String {
        match self.raw_before {
            Some(at) if attempt.started_at < at => attempt.id.to_string(),
            _ => self.key_for(attempt.id),
        }
    }
}

/// HMAC-SHA256 (RFC 2104) over `sha2`'s SHA-256.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(message);
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// RFC 4231's test cases 1, 2 and 6 (a key longer than the block).
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn keys_are_the_id_without_a_secret_and_unpredictable_with_one() {
        let id = Uuid::from_u128(0x0123_4567_89ab_8def_8123_4567_89ab_0001);
        assert_eq!(ProviderKeys::attempt_id().key_for(id), id.to_string());
        let a = ProviderKeys::keyed([7u8; 32]);
        let b = ProviderKeys::keyed([8u8; 32]);
        let ka = a.key_for(id);
        assert!(ka.starts_with(KEYED_PREFIX) && ka.len() == 70, "{ka}");
        assert_eq!(ka, a.key_for(id), "deterministic");
        assert_ne!(ka, b.key_for(id), "another secret, another key");
        assert_ne!(ka, a.key_for(Uuid::from_u128(1)));
        assert!(!ka.contains(&id.to_string()));
        assert!(!format!("{a:?}").contains("7"), "{a:?}");
    }

    #[test]
    #[should_panic(expected = "at least 16 bytes")]
    fn short_secrets_are_refused() {
        ProviderKeys::keyed("short");
    }
}

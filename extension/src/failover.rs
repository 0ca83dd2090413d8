//! Failover: an attempt on a provider other than the job's own.
//!
//! Providers are not interchangeable because they share an HTTP client and a JSON schema. A
//! failover needs the job to name a contract and the provider to hold a current certification
//! for it. Until contracts and certifications exist in the schema, every failover is refused.

use crate::job::Job;
use crate::refusal::{Answer, Refusal};
use pgrx::spi::SpiClient;

/// Refuses (IJ005) a failover to `provider` unless it is certified for the job's contract.
pub fn check(_client: &mut SpiClient<'_>, job: &Job, provider: &str) -> Answer<()> {
    let why = match &job.contract {
        None => format!(
            "job {} names no contract, so no other provider can be trusted with it",
            job.id
        ),
        Some(contract) => {
            format!("provider \"{provider}\" holds no certification for contract \"{contract}\"")
        }
    };
    Err(Refusal::provider_not_certified(format!(
        "failover of job {} to provider \"{provider}\" is not allowed",
        job.id
    ))
    .detail(format!("The job's provider is \"{}\"; {why}.", job.provider))
    .hint("Certify the provider for the job's contract with intent.certify_provider(), or begin the attempt on the job's own provider."))
}

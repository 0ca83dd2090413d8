//! Building a suite: [`ContractSuite`], its cases, how an input is rendered and an answer
//! parsed, and the round trip it tests ([`ContractSuite::ask`]), for production use too
//! ([`ContractSuite::work_for`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use pg_intent_client::{ProviderKeys, WorkError};
use serde_json::Value;
use uuid::Uuid;

use crate::types::check_temperature;
use crate::{
    Failure, Prompt, Provider, ProviderError, Request, RunOptions, neutralise_control_tokens,
};

/// One input of a suite.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Names the case in reports.
    pub name: String,
    /// The input, as a job's params would carry it.
    pub input: Value,
}

pub(crate) type Render = dyn Fn(&Value) -> Prompt + Send + Sync;
pub(crate) type Parse = dyn Fn(&str) -> Result<Value, String> + Send + Sync;
pub(crate) type Check = dyn Fn(&Value, &Value) -> Result<(), String> + Send + Sync;

/// The contract tests of one contract: the cases, how an input is rendered into a prompt, and
/// how an answer is parsed.
#[derive(Clone)]
pub struct ContractSuite {
    contract: String,
    pub(crate) cases: Vec<Case>,
    /// The assertion of each case, in the order of `cases`.
    pub(crate) checks: Vec<Option<Arc<Check>>>,
    render: Arc<Render>,
    pub(crate) parse: Arc<Parse>,
    /// The provider idempotency key of an attempt ([`ContractSuite::ask_for`]).
    keys: ProviderKeys,
}

impl fmt::Debug for ContractSuite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContractSuite")
            .field("contract", &self.contract)
            .field("cases", &self.cases)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// The default parser: the whole answer, trimmed, must be one JSON value. No Markdown fences,
/// no prose around it: a provider that ignores the format fails.
pub fn parse_json(raw: &str) -> Result<Value, String> {
    serde_json::from_str(raw.trim()).map_err(|e| e.to_string())
}

impl ContractSuite {
    /// A suite for `contract` with no cases yet, rendering each input with `render` and parsing
    /// answers with [`parse_json`].
    pub fn new(
        contract: impl Into<String>,
        render: impl Fn(&Value) -> Prompt + Send + Sync + 'static,
    ) -> Self {
        ContractSuite {
            contract: contract.into(),
            cases: Vec::new(),
            checks: Vec::new(),
            render: Arc::new(render),
            parse: Arc::new(parse_json),
            keys: ProviderKeys::default(),
        }
    }

    /// How an attempt's provider idempotency key is derived ([`ContractSuite::ask_for`]):
    /// default [`ProviderKeys::attempt_id`], the attempt id itself. Give a keyed derivation
    /// ([`ProviderKeys::keyed`], [`ProviderKeys::from_env`]) when parties that must not decide
    /// each other's attempts share a provider account ([`pg_intent_client::provider_keys`]); a
    /// [`RequestLookup`](crate::RequestLookup) made from this suite asks under the same keys.
    pub fn provider_keys(mut self, keys: ProviderKeys) -> Self {
        self.keys = keys;
        self
    }

    /// The derivation of [`ContractSuite::provider_keys`].
    pub fn keys(&self) -> &ProviderKeys {
        &self.keys
    }

    /// Adds a case.
    pub fn case(mut self, name: impl Into<String>, input: Value) -> Self {
        self.cases.push(Case {
            name: name.into(),
            input,
        });
        self.checks.push(None);
        self
    }

    /// Adds a case whose output must also satisfy `check(input, output)`: what the contract
    /// cannot say because it depends on the input (the caption names *this* subject, the total
    /// is *this* order's). The check runs after the database accepted the output; an `Err`
    /// fails the run with [`Failure::Check`] and its message. Each run's evidence records
    /// whether it held.
    pub fn case_with(
        mut self,
        name: impl Into<String>,
        input: Value,
        check: impl Fn(&Value, &Value) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self = self.case(name, input);
        *self.checks.last_mut().expect("a case was just added") = Some(Arc::new(check));
        self
    }

    /// Parses answers with `parse` instead of [`parse_json`] (use the parser production uses).
    pub fn parse_with(
        mut self,
        parse: impl Fn(&str) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        self.parse = Arc::new(parse);
        self
    }

    /// The contract's name.
    pub fn contract(&self) -> &str {
        &self.contract
    }

    /// The cases, in order.
    pub fn cases(&self) -> &[Case] {
        &self.cases
    }

    /// Whether case `index` (in [`ContractSuite::cases`]) asserts on its output.
    pub fn has_check(&self, index: usize) -> bool {
        self.checks.get(index).is_some_and(Option::is_some)
    }

    /// The prompt for `input`.
    pub fn render(&self, input: &Value) -> Prompt {
        (self.render)(input)
    }

    /// The prompt sent for `input`: [`ContractSuite::render`]'s, with the user prompt's control
    /// tokens neutralised ([`neutralise_control_tokens`]: each of
    /// [`DEFAULT_CONTROL_TOKENS`](crate::DEFAULT_CONTROL_TOKENS) broken by a word joiner), so that
    /// text put into the user prompt reaches the model as text, however the render assembled it.
    /// [`ContractSuite::ask`] and [`run`](crate::run) send this one, and the rendering checks check
    /// it; the system prompt is sent as rendered. A tokenizer's own control tokens outside that
    /// list must be neutralised by the render ([`neutralise_with`](crate::neutralise_with)); the
    /// rendering checks try them.
    pub fn prompt_for(&self, input: &Value) -> Prompt {
        let mut prompt = self.render(input);
        prompt.user = neutralise_control_tokens(&prompt.user);
        prompt
    }

    /// Parses an answer.
    pub fn parse(&self, raw: &str) -> Result<Value, String> {
        (self.parse)(raw)
    }

    /// The round trip the suite tests, for production use too: renders `input`, calls
    /// `provider` (within [`RunOptions::call_timeout`]) and parses its answer.
    ///
    /// The output is not checked against the contract here: the database does that when the attempt
    /// completes (or in [`run`](crate::run), with [`pg_intent_client::validate_result`]). A
    /// temperature out of range fails with a [`Delivery::NotSent`](crate::Delivery::NotSent)
    /// provider error, before any call.
    pub async fn ask<P: Provider>(
        &self,
        provider: &P,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, Failure> {
        self.ask_keyed(provider, input, options, None).await
    }

    /// [`ContractSuite::ask`] for an attempt: the call carries the attempt's provider
    /// idempotency key ([`Request::idempotency_key`]: the attempt id, or its keyed derivation,
    /// [`ContractSuite::provider_keys`]), so that the provider does the work once however
    /// often it is sent, and a [`pg_intent_client::Reconciler`] can ask the provider what became
    /// of an attempt whose outcome is unknown.
    pub async fn ask_for<P: Provider>(
        &self,
        provider: &P,
        attempt_id: Uuid,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, Failure> {
        self.ask_keyed(
            provider,
            input,
            options,
            Some(self.keys.key_for(attempt_id)),
        )
        .await
    }

    async fn ask_keyed<P: Provider>(
        &self,
        provider: &P,
        input: &Value,
        options: &RunOptions,
        key: Option<String>,
    ) -> Result<Value, Failure> {
        check_temperature(options.temperature)
            .map_err(|e| Failure::Provider(ProviderError::not_sent(e)))?;
        let mut request = Request::new(&self.prompt_for(input), options);
        request.idempotency_key = key;
        self.ask_with(provider, &request, options.call_timeout)
            .await
    }

    /// [`ContractSuite::ask`] as a [`pg_intent_client::Worker`]'s work: the failure mapped by
    /// [`Failure::into_work_error`], so that only a known outcome is reported as failed and
    /// everything after sending is marked unknown.
    ///
    /// Give the worker a timeout longer than [`RunOptions::call_timeout`]: the call's own
    /// timeout then decides, with the reason it knows.
    pub async fn work<P: Provider>(
        &self,
        provider: &P,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, WorkError<Value>> {
        self.ask(provider, input, options)
            .await
            .map_err(|failure| failure.into_work_error(provider.name()))
    }

    /// [`ContractSuite::work`] for an attempt, its id the provider's idempotency key
    /// ([`ContractSuite::ask_for`]): what a worker should run.
    pub async fn work_for<P: Provider>(
        &self,
        provider: &P,
        attempt_id: Uuid,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, WorkError<Value>> {
        self.ask_for(provider, attempt_id, input, options)
            .await
            .map_err(|failure| failure.into_work_error(provider.name()))
    }

    pub(crate) async fn ask_with<P: Provider>(
        &self,
        provider: &P,
        request: &Request,
        timeout: Duration,
    ) -> Result<Value, Failure> {
        let raw = match tokio::time::timeout(timeout, provider.call(request)).await {
            Err(_) => return Err(Failure::Timeout(timeout)),
            Ok(Err(e)) => return Err(Failure::Provider(e)),
            Ok(Ok(raw)) => raw,
        };
        self.parse(&raw)
            .map_err(|error| Failure::NotJson { error, raw })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_default_parser_is_strict() {
        assert_eq!(parse_json(" {\"a\": 1}\n").unwrap(), json!({"a": 1}));
        assert!(parse_json("```json\n{\"a\": 1}\n```").is_err());
        assert!(parse_json("Sure! {\"a\": 1}").is_err());
        assert!(parse_json("{\"a\": 1} and more").is_err());
    }
}

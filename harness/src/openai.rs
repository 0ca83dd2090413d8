//! A [`Provider`] for any OpenAI-compatible chat-completions API (feature `openai`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::redact::{scrub, url_secrets};
use crate::evidence::cut;
use crate::suite::Parse;
use crate::{
    ContractSuite, Delivery, Provider, ProviderError, Request, check_temperature, redact_url,
};
use pg_intent_client::reconciler::{Lookup, LookupFuture, ProviderStatus};
use pg_intent_client::runner::BoxError;
use pg_intent_client::{AttemptRecord, ProviderKeys, StatusLookup};

/// How much of an error answer's body is read (and at most [`ERROR_BODY_CHARS`] of it kept).
const ERROR_BODY_BYTES: usize = 64 * 1024;

/// How much of an error answer's body is kept in a [`ProviderError`].
const ERROR_BODY_CHARS: usize = 500;

/// The most bytes of an answer [`OpenAiCompatible`] reads unless told otherwise: 8 MiB, far
/// above any chat completion a contract could accept (results are at most 1 MiB).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 << 20;

/// How long [`OpenAiCompatible::new`]'s client may take to connect: 10 seconds. A provider that
/// cannot be reached within it fails as [`Delivery::NotSent`], before a call timeout (whose
/// outcome is unknown) would.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A provider behind an OpenAI-compatible API: `POST {base_url}/v1/chat/completions` with a
/// system and a user message, answering `choices[0].message.content`.
///
/// Plain HTTP and HTTPS (rustls with the webpki roots; no OpenSSL). A `base_url` that already
/// ends in `/v1` is used as it is (`https://api.example.com/v1` and `https://api.example.com`
/// name the same endpoint); a query string stays at the end.
///
/// Credentials in the URL (`https://user:secret@host/`, `?api-key=…`) are sent, and shown
/// nowhere: [`OpenAiCompatible::endpoint`], the evidence, `Debug` and `Display` show the URL
/// through [`redact_url`] (which reads it as reqwest does: `https:///user:secret@host` sends
/// basic auth too), the API key is never shown, and transport errors lose their URL. Error texts
/// lose every echo of the user, the password, the query values (as written and
/// percent-decoded) and the API key; a secret shorter than 4 bytes only where it stands alone,
/// not inside a word.
///
/// Answers are read up to [`OpenAiCompatible::max_response_bytes`] (default
/// [`DEFAULT_MAX_RESPONSE_BYTES`]): a larger one fails as [`Delivery::Answered`] ("larger than
/// …") as soon as its `Content-Length`, or the bytes read so far, pass the limit, without
/// buffering the rest.
///
/// ```
/// use pg_intent_harness::{OpenAiCompatible, Provider};
/// let p = OpenAiCompatible::new("gpu-b", "http://127.0.0.1:8089/", "captioner-2");
/// assert_eq!(p.endpoint(), "http://127.0.0.1:8089/v1/chat/completions");
/// assert_eq!(p.settings()["model"], "captioner-2");
/// let q = OpenAiCompatible::new("gpu-c", "https://me:pw@api.example.com/v1?key=sk-1", "m");
/// assert_eq!(q.endpoint(), "https://redacted@api.example.com/v1/chat/completions?key=redacted");
/// ```
#[derive(Clone)]
pub struct OpenAiCompatible {
    name: String,
    /// The URL requests are posted to, credentials and all.
    url: String,
    /// `url` as shown: [`redact_url`].
    endpoint: String,
    model: String,
    api_key: Option<String>,
    max_response_bytes: usize,
    http: reqwest::Client,
}

impl fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "…"))
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for OpenAiCompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} at {})", self.name, self.model, self.endpoint)
    }
}

/// The client a provider (and its [`super::ServerTokenizer`]) gets unless given one: it
/// connects within [`DEFAULT_CONNECT_TIMEOUT`] and follows no redirect (every 3xx is the
/// provider's answer: a 303 says it processed the request).
///
/// # Panics
///
/// If the TLS backend cannot be initialised (as `reqwest::Client::new` does).
pub(super) fn default_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(DEFAULT_CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("the TLS backend initialises")
}

/// `{base}/v1/chat/completions`, the query string kept at the end and the fragment dropped.
fn endpoint_of(base_url: &str) -> String {
    let base = base_url.split_once('#').map_or(base_url, |(b, _)| b);
    let (base, query) = match base.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (base, None),
    };
    let base = base.trim_end_matches('/');
    let mut url = if base.ends_with("/v1") {
        format!("{base}/chat/completions")
    } else {
        format!("{base}/v1/chat/completions")
    };
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}

impl OpenAiCompatible {
    /// The provider `name` (as pg_intent knows it) served at `base_url` by `model`.
    ///
    /// # Panics
    ///
    /// If the TLS backend cannot be initialised (as `reqwest::Client::new` does); supply your
    /// own client with [`OpenAiCompatible::with_client`] to handle that.
    pub fn new(name: impl Into<String>, base_url: &str, model: impl Into<String>) -> Self {
        let url = endpoint_of(base_url);
        OpenAiCompatible {
            name: name.into(),
            endpoint: redact_url(&url),
            url,
            model: model.into(),
            api_key: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            http: default_client(),
        }
    }

    /// Sends `Authorization: Bearer {key}` (never shown or recorded).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Uses `client` for the requests (its proxies, timeouts, certificates). Give it a connect
    /// timeout (as [`DEFAULT_CONNECT_TIMEOUT`]) shorter than the call timeout, and no redirects
    /// (`reqwest::redirect::Policy::none()`, as [`OpenAiCompatible::new`]'s): a client that
    /// follows them hides a `303 See Other` (the request was processed), so an error status
    /// reached by following a redirect, and a redirect error, count as
    /// [`Delivery::Unknown`].
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.http = client;
        self
    }

    /// Reads at most `bytes` of an answer (default [`DEFAULT_MAX_RESPONSE_BYTES`]).
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// The URL requests are posted to, as shown ([`redact_url`]: without credentials).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The model asked for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The base URL the chat endpoint was derived from (credentials and query kept), for the
    /// provider's [`super::ServerTokenizer`].
    pub(super) fn url_for_tokenizer(&self) -> String {
        let (path, query) = match self.url.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (self.url.as_str(), None),
        };
        let root = path.strip_suffix("/chat/completions").unwrap_or(path);
        match query {
            Some(q) => format!("{root}?{q}"),
            None => root.to_string(),
        }
    }

    pub(super) fn http_client(&self) -> reqwest::Client {
        self.http.clone()
    }

    pub(super) fn api_key_for_tokenizer(&self) -> Option<String> {
        self.api_key.clone()
    }

    /// The request body for `request`.
    fn body(&self, request: &Request) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.user},
            ],
            "temperature": request.temperature,
        });
        if let Some(max_tokens) = request.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        if let Some(seed) = request.seed {
            body["seed"] = json!(seed);
        }
        body
    }

    /// `text` with every credential this provider holds replaced: the URL's userinfo and query
    /// values as reqwest reads them (percent-decoded too), and the API key.
    fn scrub(&self, text: &str) -> String {
        let mut secrets = url_secrets(&self.url);
        secrets.extend(self.api_key.iter().filter(|k| !k.is_empty()).cloned());
        scrub(text, &secrets)
    }

    /// A transport error, by which side of "sent" it happened on.
    fn transport_error(&self, e: reqwest::Error, reading_body: bool) -> ProviderError {
        // reqwest's message names the URL, credentials and all.
        let e = e.without_url();
        let delivery = if reading_body {
            // The provider answered and the body broke off: it did the work, and we lost it.
            Delivery::Unknown
        } else if e.is_builder() || e.is_connect() {
            Delivery::NotSent
        } else if e.is_redirect() {
            // Too many redirects, or a policy's error: a hop may have been a 303, whose
            // request was processed.
            Delivery::Unknown
        } else {
            // Sent, or maybe sent: a timeout, a reset, a closed connection.
            Delivery::Unknown
        };
        let message = self.scrub(&with_causes(&e));
        let mut error = match delivery {
            Delivery::NotSent => ProviderError::not_sent(message),
            Delivery::Refused => ProviderError::refused(message),
            Delivery::Answered => ProviderError::answered(message),
            Delivery::Unknown => ProviderError::unknown(message),
        };
        if reading_body {
            error.message = format!("the answer broke off: {}", error.message);
        }
        error.with_source(e)
    }
}

/// An error with its causes, as one line (reqwest's own message hides them).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `Retry-After` in seconds (an HTTP date is taken as present, of unknown length).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Option<Duration>> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?;
    Some(
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs),
    )
}

/// Reads the body, at most `limit` bytes: `Ok(Err(()))` when it is longer.
async fn read_at_most(
    response: &mut reqwest::Response,
    limit: usize,
) -> Result<Result<Vec<u8>, ()>, reqwest::Error> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Ok(Err(()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > limit {
            return Ok(Err(()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Ok(body))
}

impl Provider for OpenAiCompatible {
    fn name(&self) -> &str {
        &self.name
    }

    fn settings(&self) -> Value {
        json!({
            "api": "openai-chat-completions",
            "endpoint": self.endpoint,
            "model": self.model,
            "authenticated": self.api_key.is_some(),
            "max_response_bytes": self.max_response_bytes,
        })
    }

    async fn call(&self, request: &Request) -> Result<String, ProviderError> {
        check_temperature(request.temperature).map_err(ProviderError::not_sent)?;
        let body = serde_json::to_vec(&self.body(request)).map_err(|e| {
            ProviderError::not_sent(format!("could not encode the request: {e}")).with_source(e)
        })?;
        let mut post = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(key) = &self.api_key {
            post = post.bearer_auth(key);
        }
        if let Some(key) = &request.idempotency_key {
            post = post.header("Idempotency-Key", key);
        }
        let mut response = post
            .send()
            .await
            .map_err(|e| self.transport_error(e, false))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        // A client that follows redirects may have passed a 303 on the way here.
        let redirected = reqwest::Url::parse(&self.url).is_ok_and(|u| &u != response.url());
        if !status.is_success() {
            // The status is the answer; the body only explains it, so a body that breaks off
            // or runs long changes nothing (the start is kept).
            let bytes = match read_at_most(&mut response, ERROR_BODY_BYTES).await {
                Ok(Ok(bytes)) => bytes,
                _ => Vec::new(),
            };
            // OpenAI-style errors say {"error": {"message": …}}; otherwise keep the body's start.
            let message = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v.pointer("/error/message")?.as_str().map(str::to_string))
                .unwrap_or_else(|| {
                    String::from_utf8_lossy(&bytes)
                        .chars()
                        .take(ERROR_BODY_CHARS)
                        .collect()
                });
            let error = ProviderError::http(status.as_u16(), self.scrub(&message));
            let mut error = match retry_after {
                Some(Some(after)) => error.retry_after(after),
                Some(None) => ProviderError {
                    delivery: Delivery::of_status(status.as_u16(), true),
                    ..error
                },
                None => error,
            };
            if redirected {
                // Whatever this hop says, an earlier one may have processed the request.
                error.delivery = Delivery::Unknown;
                error.message = format!("after a redirect: {}", error.message);
            }
            return Err(error);
        }
        let bytes = match read_at_most(&mut response, self.max_response_bytes).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(())) => {
                return Err(ProviderError::answered(format!(
                    "the answer is larger than {} bytes (max_response_bytes)",
                    self.max_response_bytes
                ))
                .with_status(status.as_u16()));
            }
            Err(e) => return Err(self.transport_error(e, true).with_status(status.as_u16())),
        };
        let answer: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ProviderError::answered(format!("the answer is not a chat completion: {e}"))
                .with_status(status.as_u16())
        })?;
        answer
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                ProviderError::answered("the answer has no choices[0].message.content text")
                    .with_status(status.as_u16())
            })
    }
}

impl OpenAiCompatible {
    /// `{base}/v1/requests/{key}`: where the provider says what became of the request sent
    /// under idempotency key `key` (the query string kept).
    fn status_url(&self, key: &str) -> String {
        let (path, query) = match self.url.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (self.url.as_str(), None),
        };
        let base = path.strip_suffix("/chat/completions").unwrap_or(path);
        // A path segment: everything but RFC 3986's unreserved characters escaped.
        const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'.')
            .remove(b'_')
            .remove(b'~');
        let key: String = percent_encoding::utf8_percent_encode(key, SEGMENT).collect();
        match query {
            Some(q) => format!("{base}/requests/{key}?{q}"),
            None => format!("{base}/requests/{key}"),
        }
    }

    /// Asks what became of the request sent under idempotency key `key`:
    /// `GET {base}/v1/requests/{key}` (see [`RequestLookup`] for the answers it reads).
    async fn request_status(&self, key: &str, parse: &Parse) -> Result<Lookup, BoxError> {
        let url = self.status_url(key);
        let mut get = self.http.get(&url);
        if let Some(api_key) = &self.api_key {
            get = get.bearer_auth(api_key);
        }
        let asked = redact_url(&url);
        let lost = |e: reqwest::Error| -> BoxError {
            format!(
                "GET {asked}: {}",
                self.scrub(&with_causes(&e.without_url()))
            )
            .into()
        };
        let mut response = get.send().await.map_err(lost)?;
        let status = response.status().as_u16();
        let body = match read_at_most(&mut response, self.max_response_bytes)
            .await
            .map_err(lost)?
        {
            Ok(bytes) => bytes,
            Err(()) => return Err(format!("GET {asked}: the answer is too large").into()),
        };
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let message = answer
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map(|m| self.scrub(m));
        let mut evidence = json!({"asked": format!("GET {asked}"), "http_status": status});
        if let Some(message) = &message {
            evidence["message"] = json!(cut(message));
        }
        // A 404 or 410 decides only as the status API's own answer (its error type), never
        // as a route the server does not have, a proxy's, or a misconfigured base URL's.
        let own = match status {
            404 => Some("not_found"),
            410 => Some("expired"),
            _ => None,
        };
        if let Some(own) = own
            && answer.pointer("/error/type").and_then(Value::as_str) != Some(own)
        {
            return Err(format!(
                "GET {asked}: HTTP {status} that is not the status API's answer{}",
                message
                    .as_ref()
                    .map(|m| format!(": {}", cut(m)))
                    .unwrap_or_default()
            )
            .into());
        }
        let status = match status {
            404 => ProviderStatus::NeverReceived,
            410 => ProviderStatus::CannotTell,
            200 => {
                let said = answer.get("status").and_then(Value::as_str).unwrap_or("");
                evidence["status"] = json!(said);
                let response = answer.get("response").unwrap_or(&Value::Null);
                if let Some(id) = response.get("id") {
                    evidence["provider_request_id"] = id.clone();
                }
                match said {
                    "running" => ProviderStatus::Running,
                    "succeeded" => {
                        let content = response
                            .pointer("/choices/0/message/content")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                format!(
                                    "GET {asked}: a succeeded request without choices[0].message.content"
                                )
                            })?;
                        match parse(content) {
                            Ok(output) => ProviderStatus::Done(output),
                            // As the worker would have reported the answer: a definite failure.
                            Err(error) => ProviderStatus::Failed(json!({
                                "kind": "not_json", "error": error, "raw": cut(content),
                                "provider": self.name,
                            })),
                        }
                    }
                    "failed" => ProviderStatus::Failed(json!({
                        "kind": "provider",
                        "delivery": Delivery::Refused.as_str(),
                        "status": answer.get("http_status"),
                        "message": response
                            .pointer("/error/message")
                            .and_then(Value::as_str)
                            .map(|m| cut(&self.scrub(m))),
                        "provider": self.name,
                    })),
                    other => {
                        return Err(format!("GET {asked}: unknown request status {other:?}").into());
                    }
                }
            }
            other => {
                return Err(format!(
                    "GET {asked}: HTTP {other}{}",
                    message
                        .map(|m| format!(": {}", cut(&m)))
                        .unwrap_or_default()
                )
                .into());
            }
        };
        Ok(Lookup::new(status).evidence(evidence))
    }
}

/// A [`StatusLookup`] for OpenAI-compatible providers that keep requests by idempotency key
/// (feature `openai`): asks `GET {base}/v1/requests/{key}` of the attempt's provider, `key`
/// the attempt's provider key ([`ProviderKeys::lookup_key`]: its id, or its keyed derivation),
/// with its credentials, and reads the answer as pg_intent's test provider gives it:
///
/// | the provider answers | [`ProviderStatus`] |
/// |---|---|
/// | `200 {"status": "succeeded", "response": <chat completion>}` | `Done`, the content parsed as the suite's workers parse it ([`ContractSuite::parse`]); an answer that does not parse is `Failed`, as [`ContractSuite::work_for`] reports it |
/// | `200 {"status": "failed", "http_status", "response": <error>}` | `Failed` (refused, nothing done) |
/// | `200 {"status": "running"}` | `Running` |
/// | `404 {"error": {"type": "not_found"}}` | `NeverReceived` |
/// | `410 {"error": {"type": "expired"}}` | `CannotTell` (its records of the request expired) |
/// | a `404` or `410` without that type (a route the server does not have, a proxy) | an `Err`: nothing is decided |
/// | anything else, or no answer | an `Err`: nothing is decided |
///
/// An attempt of a provider it was not given is an `Err` too: nobody asked, nothing decided.
/// The evidence is the URL asked (without credentials), the HTTP status, the provider's status
/// and request id, and its message (without credentials).
#[derive(Clone)]
pub struct RequestLookup {
    providers: HashMap<String, OpenAiCompatible>,
    parse: Arc<Parse>,
    keys: ProviderKeys,
}

impl fmt::Debug for RequestLookup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestLookup")
            .field("providers", &self.providers)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl RequestLookup {
    /// A lookup that parses a finished answer as `suite` does, and asks under the keys the
    /// suite's workers send ([`ContractSuite::provider_keys`]); add the providers with
    /// [`RequestLookup::provider`].
    pub fn new(suite: &ContractSuite) -> Self {
        RequestLookup {
            providers: HashMap::new(),
            parse: suite.parse.clone(),
            keys: suite.keys().clone(),
        }
    }

    /// Asks under these keys instead of the suite's ([`ProviderKeys::lookup_key`]): the same
    /// derivation as the workers', or the provider's "done" is never found (and is not trusted
    /// under any other key).
    pub fn provider_keys(mut self, keys: ProviderKeys) -> Self {
        self.keys = keys;
        self
    }

    /// Asks `provider` about the attempts of its name ([`Provider::name`]).
    pub fn provider(mut self, provider: OpenAiCompatible) -> Self {
        self.providers.insert(provider.name.clone(), provider);
        self
    }
}

impl StatusLookup for RequestLookup {
    fn lookup<'a>(&'a self, attempt: &'a AttemptRecord) -> LookupFuture<'a> {
        Box::pin(async move {
            let provider = self.providers.get(&attempt.provider).ok_or_else(|| {
                format!(
                    "no status lookup for provider {:?}: ask it by hand (docs/runbook.md § 2.1)",
                    attempt.provider
                )
            })?;
            provider
                .request_status(&self.keys.lookup_key(attempt), &*self.parse)
                .await
        })
    }
}

impl ProviderError {
    fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_bodies() {
        for base in [
            "http://h:1",
            "http://h:1/",
            "http://h:1/v1",
            "http://h:1/v1/",
        ] {
            assert_eq!(
                OpenAiCompatible::new("p", base, "m").endpoint(),
                "http://h:1/v1/chat/completions"
            );
        }
        let p = OpenAiCompatible::new("p", "http://u:pw-secret@h:1/?key=q-secret", "m")
            .api_key("sk-secret");
        assert_eq!(
            p.url,
            "http://u:pw-secret@h:1/v1/chat/completions?key=q-secret"
        );
        assert_eq!(
            p.endpoint(),
            "http://redacted@h:1/v1/chat/completions?key=redacted"
        );
        for shown in [
            format!("{p:?}"),
            format!("{p}"),
            p.settings().to_string(),
            p.endpoint().to_string(),
        ] {
            assert!(!shown.contains("secret"), "{shown}");
        }
        assert_eq!(
            p.scrub("bad key sk-secret for pw-secret, q-secret"),
            "bad key redacted for redacted, redacted"
        );
        // Echoed as sent (percent-decoded), and short ones where they stand alone.
        let p = OpenAiCompatible::new("p", "https:///bo:p%40ss%20w@h/?k=a%2Fb", "m").api_key("K1");
        assert_eq!(
            p.scrub("user bo, password 'p@ss w' (p%40ss%20w), k=a/b, key K1; bob K1x"),
            "user redacted, password 'redacted' (redacted), k=redacted, key redacted; bob K1x"
        );
        let body = p.body(&Request {
            system: "S".into(),
            user: "U".into(),
            temperature: 0.1,
            max_tokens: Some(50),
            seed: None,
            idempotency_key: None,
        });
        assert_eq!(
            body,
            json!({
                "model": "m",
                "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                "temperature": 0.1,
                "max_tokens": 50,
            })
        );
    }
}

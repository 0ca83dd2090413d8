//! A [`Provider`] for any OpenAI-compatible chat-completions API (feature `openai`).

use std::fmt;

use serde_json::{Value, json};

use super::{Provider, ProviderError, Request};

/// How much of an error answer's body is kept in a [`ProviderError`].
const ERROR_BODY_CHARS: usize = 500;

/// A provider behind an OpenAI-compatible API: `POST {base_url}/v1/chat/completions` with a
/// system and a user message, answering `choices[0].message.content`.
///
/// Plain HTTP and HTTPS (rustls with the webpki roots; no OpenSSL). A `base_url` that already
/// ends in `/v1` is used as it is (`https://api.example.com/v1` and `https://api.example.com`
/// name the same endpoint).
///
/// ```
/// use pg_intent_client::harness::{OpenAiCompatible, Provider};
/// let p = OpenAiCompatible::new("gpu-b", "http://127.0.0.1:8089/", "captioner-2");
/// assert_eq!(p.endpoint(), "http://127.0.0.1:8089/v1/chat/completions");
/// assert_eq!(p.settings()["model"], "captioner-2");
/// ```
#[derive(Clone)]
pub struct OpenAiCompatible {
    name: String,
    endpoint: String,
    model: String,
    api_key: Option<String>,
    http: reqwest::Client,
}

impl fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

impl OpenAiCompatible {
    /// The provider `name` (as pg_intent knows it) served at `base_url` by `model`.
    ///
    /// # Panics
    ///
    /// If the TLS backend cannot be initialised (as `reqwest::Client::new` does); supply your
    /// own client with [`OpenAiCompatible::with_client`] to handle that.
    pub fn new(name: impl Into<String>, base_url: &str, model: impl Into<String>) -> Self {
        let base = base_url.trim_end_matches('/');
        let endpoint = if base.ends_with("/v1") {
            format!("{base}/chat/completions")
        } else {
            format!("{base}/v1/chat/completions")
        };
        OpenAiCompatible {
            name: name.into(),
            endpoint,
            model: model.into(),
            api_key: None,
            http: reqwest::Client::new(),
        }
    }

    /// Sends `Authorization: Bearer {key}` (never recorded in the evidence).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Uses `client` for the requests (its proxies, timeouts, certificates).
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.http = client;
        self
    }

    /// The URL requests are posted to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The model asked for.
    pub fn model(&self) -> &str {
        &self.model
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
        })
    }

    async fn call(&self, request: &Request) -> Result<String, ProviderError> {
        let body = serde_json::to_vec(&self.body(request))
            .map_err(|e| ProviderError::new(format!("could not encode the request: {e}")))?;
        let mut post = self
            .http
            .post(&self.endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(key) = &self.api_key {
            post = post.bearer_auth(key);
        }
        let response = post
            .send()
            .await
            .map_err(|e| ProviderError::new(with_causes(&e)))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| ProviderError::new(with_causes(&e)))?;
        if !status.is_success() {
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
            return Err(ProviderError::http(status.as_u16(), message));
        }
        let answer: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ProviderError::new(format!("the answer is not a chat completion: {e}")))?;
        answer
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| ProviderError::new("the answer has no choices[0].message.content text"))
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
        let p = OpenAiCompatible::new("p", "http://h:1", "m").api_key("secret");
        assert!(!format!("{p:?}").contains("secret"));
        assert!(!p.settings().to_string().contains("secret"));
        let body = p.body(&Request {
            system: "S".into(),
            user: "U".into(),
            temperature: 0.1,
            max_tokens: Some(50),
            seed: None,
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

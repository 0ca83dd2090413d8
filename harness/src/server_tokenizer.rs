//! [`ServerTokenizer`]: the provider's own `/tokenize` and `/detokenize` endpoints (feature
//! `openai`).

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};

use super::Prompt;
use super::openai::{OpenAiCompatible, default_client};
use super::redact::{scrub, url_secrets};
use super::redact_url;
use super::render::{Chat, RenderError, Tokenizer, TokenizerFuture};

/// The most bytes of a tokenizer endpoint's answer read: 16 MiB (a few million token ids).
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// How long one tokenizer request may take: 30 seconds.
pub const TOKENIZER_TIMEOUT: Duration = Duration::from_secs(30);

/// Which tokenizer API a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenizerApi {
    /// vLLM's (and SGLang's): `POST /tokenize` with `{"model", "messages",
    /// "add_generation_prompt"}` (the server applies its chat template) or `{"model",
    /// "prompt", "add_special_tokens": false}`, answering `{"tokens", "count",
    /// "max_model_len"}`; `POST /detokenize` with `{"model", "tokens"}`, answering
    /// `{"prompt"}`.
    Vllm,
    /// llama.cpp's server: `POST /apply-template` with `{"messages"}` answering `{"prompt"}`
    /// (the rendered text); `POST /tokenize` with `{"content", "add_special": false,
    /// "parse_special": true}` answering `{"tokens"}` (as its chat endpoint tokenizes the
    /// rendered prompt); `POST /detokenize` with `{"tokens"}` answering `{"content"}`; the
    /// context window from `GET /props` (`default_generation_settings.n_ctx`).
    LlamaCpp,
    /// Hugging Face TGI's: `POST /chat_tokenize` with `{"model", "messages"}` answering
    /// `{"templated_text", "tokenize_response": [{"id", "text", "start", "stop"}, …]}`;
    /// `POST /tokenize` with `{"inputs", "add_special_tokens": false}` answering that list; the
    /// context window from `GET /info` (`max_total_tokens`). TGI has no `/detokenize`: the text
    /// of ids is read from the pieces (`text`) its answers gave for them, so `round_trip` checks
    /// that the templated text tokenizes back to the chat's ids, and the pieces of ids it never
    /// answered cannot be read (an error, and the check fails).
    Tgi,
}

impl TokenizerApi {
    fn as_str(self) -> &'static str {
        match self {
            TokenizerApi::Vllm => "vllm",
            TokenizerApi::LlamaCpp => "llama.cpp",
            TokenizerApi::Tgi => "tgi",
        }
    }
}

/// A provider's tokenizer reached over its own HTTP API ([`TokenizerApi`]): what the server
/// will do to a prompt, exactly. The paths are at the server's root (`{root}/tokenize`), the
/// root being the base URL without a trailing `/v1`.
#[derive(Clone)]
pub struct ServerTokenizer {
    api: TokenizerApi,
    /// The root URL, credentials and all (a query string kept for each request).
    root: String,
    query: Option<String>,
    model: String,
    api_key: Option<String>,
    http: reqwest::Client,
    /// The server's own control tokens, as given ([`ServerTokenizer::control_tokens`]).
    own: Vec<String>,
    /// TGI: the piece of every id its answers gave (it has no `/detokenize`).
    pieces: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u32, String>>>,
}

impl fmt::Debug for ServerTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTokenizer")
            .field("api", &self.api)
            .field("root", &redact_url(&self.url("")))
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

/// `base_url` without its fragment, split into the root (no trailing `/` or `/v1`) and query.
fn root_of(base_url: &str) -> (String, Option<String>) {
    let base = base_url.split_once('#').map_or(base_url, |(b, _)| b);
    let (base, query) = match base.split_once('?') {
        Some((b, q)) => (b, Some(q.to_string())),
        None => (base, None),
    };
    let base = base.trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    (base.to_string(), query)
}

impl ServerTokenizer {
    /// The tokenizer of `model` served at `base_url` (`https://host:8000` or
    /// `https://host:8000/v1`), speaking `api`.
    ///
    /// # Panics
    ///
    /// If the TLS backend cannot be initialised; supply a client with
    /// [`ServerTokenizer::with_client`] to handle that.
    pub fn new(base_url: &str, model: impl Into<String>, api: TokenizerApi) -> Self {
        let (root, query) = root_of(base_url);
        ServerTokenizer {
            api,
            root,
            query,
            model: model.into(),
            api_key: None,
            own: Vec::new(),
            pieces: Default::default(),
            // Each request is bounded by `send` itself (TOKENIZER_TIMEOUT), whatever the client.
            http: default_client(),
        }
    }

    /// Sends `Authorization: Bearer {key}` (never shown or recorded).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The server's own control tokens — its tokenizer's added tokens (`added_tokens` of its
    /// `tokenizer.json`, `added_tokens_decoder` of its `tokenizer_config.json`) — tried by the
    /// `control_tokens` check besides [`super::DEFAULT_CONTROL_TOKENS`]. Neither API lists
    /// them, so a token outside the defaults is checked only when given here.
    pub fn control_tokens<S: Into<String>>(mut self, tokens: impl IntoIterator<Item = S>) -> Self {
        self.own.extend(tokens.into_iter().map(Into::into));
        self
    }

    /// Uses `client` for the requests.
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.http = client;
        self
    }

    fn url(&self, path: &str) -> String {
        match &self.query {
            Some(q) => format!("{}{path}?{q}", self.root),
            None => format!("{}{path}", self.root),
        }
    }

    fn scrub(&self, text: &str) -> String {
        let mut secrets = url_secrets(&self.url(""));
        secrets.extend(self.api_key.iter().filter(|k| !k.is_empty()).cloned());
        scrub(text, &secrets)
    }

    async fn send(&self, path: &str, body: Option<Value>) -> Result<Value, RenderError> {
        // Bounded here, not by the client: `OpenAiCompatible::tokenizer` hands over the
        // provider's client, which has no request timeout (a chat call is bounded by the run's
        // call timeout instead).
        match tokio::time::timeout(TOKENIZER_TIMEOUT, self.send_unbounded(path, body)).await {
            Ok(answer) => answer,
            Err(_) => Err(RenderError(format!(
                "{path}: no answer within {TOKENIZER_TIMEOUT:?}"
            ))),
        }
    }

    async fn send_unbounded(&self, path: &str, body: Option<Value>) -> Result<Value, RenderError> {
        let url = self.url(path);
        let mut request = match &body {
            Some(body) => self
                .http
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string()),
            None => self.http.get(&url),
        };
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let fail = |what: String| RenderError(self.scrub(&format!("{path}: {what}")));
        let mut response = request
            .send()
            .await
            .map_err(|e| fail(e.without_url().to_string()))?;
        let status = response.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| fail(e.without_url().to_string()))?
        {
            if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(fail(format!(
                    "the answer is larger than {MAX_ANSWER_BYTES} bytes"
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let text: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
            return Err(fail(format!("HTTP {}: {text}", status.as_u16())));
        }
        serde_json::from_slice(&bytes).map_err(|e| fail(format!("the answer is not JSON: {e}")))
    }

    fn messages(prompt: &Prompt) -> Value {
        json!([
            {"role": "system", "content": prompt.system},
            {"role": "user", "content": prompt.user},
        ])
    }

    async fn raw_tokens(&self, text: &str) -> Result<Vec<u32>, RenderError> {
        let answer = match self.api {
            TokenizerApi::Vllm => {
                self.send(
                    "/tokenize",
                    Some(json!({"model": self.model, "prompt": text, "add_special_tokens": false})),
                )
                .await?
            }
            TokenizerApi::LlamaCpp => {
                self.send(
                    "/tokenize",
                    Some(json!({"content": text, "add_special": false, "parse_special": true})),
                )
                .await?
            }
            TokenizerApi::Tgi => {
                let answer = self
                    .send(
                        "/tokenize",
                        Some(json!({"inputs": text, "add_special_tokens": false})),
                    )
                    .await?;
                return self.tgi_ids(&answer);
            }
        };
        ids_of(&answer)
    }

    /// The ids of a TGI token list (`[{"id", "text", …}]`), keeping each id's piece.
    fn tgi_ids(&self, list: &Value) -> Result<Vec<u32>, RenderError> {
        let tokens = list
            .as_array()
            .ok_or_else(|| RenderError("the answer is not a list of tokens".into()))?;
        let mut ids = Vec::with_capacity(tokens.len());
        let mut pieces = self
            .pieces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for t in tokens {
            let id = t
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| RenderError(format!("a token without an id: {t}")))?;
            let text = t
                .get("text")
                .and_then(Value::as_str)
                .ok_or_else(|| RenderError(format!("a token without its text: {t}")))?;
            // Bounded: one piece per distinct id (a vocabulary's worth at most).
            if pieces.len() < 1 << 20 {
                pieces.entry(id).or_insert_with(|| text.to_string());
            }
            ids.push(id);
        }
        Ok(ids)
    }
}

/// The `tokens` of an answer, as ids.
fn ids_of(answer: &Value) -> Result<Vec<u32>, RenderError> {
    let tokens = answer
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or_else(|| RenderError("the answer has no \"tokens\" list".into()))?;
    tokens
        .iter()
        .map(|t| {
            // llama.cpp answers {"id", "piece"} objects when asked for pieces.
            let id = t.as_u64().or_else(|| t.get("id").and_then(Value::as_u64));
            id.and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| RenderError(format!("a token that is not an id: {t}")))
        })
        .collect()
}

fn window_of(value: Option<&Value>) -> Option<u32> {
    value
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
}

impl Tokenizer for ServerTokenizer {
    fn describe(&self) -> Value {
        json!({
            "kind": "server",
            "api": self.api.as_str(),
            "endpoint": redact_url(&self.url("/tokenize")),
            "model": self.model,
        })
    }

    fn chat<'a>(&'a self, prompt: &'a Prompt) -> TokenizerFuture<'a, Chat> {
        Box::pin(async move {
            match self.api {
                TokenizerApi::Vllm => {
                    let answer = self
                        .send(
                            "/tokenize",
                            Some(json!({
                                "model": self.model,
                                "messages": ServerTokenizer::messages(prompt),
                                "add_generation_prompt": true,
                            })),
                        )
                        .await?;
                    Ok(Chat {
                        ids: ids_of(&answer)?,
                        text: None,
                        context_window: window_of(answer.get("max_model_len")),
                    })
                }
                TokenizerApi::Tgi => {
                    let answer = self
                        .send(
                            "/chat_tokenize",
                            Some(json!({
                                "model": self.model,
                                "messages": ServerTokenizer::messages(prompt),
                            })),
                        )
                        .await?;
                    let ids =
                        self.tgi_ids(answer.get("tokenize_response").unwrap_or(&Value::Null))?;
                    let text = answer
                        .get("templated_text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            RenderError("/chat_tokenize answered no \"templated_text\"".into())
                        })?
                        .to_string();
                    let info = self.send("/info", None).await?;
                    Ok(Chat {
                        ids,
                        text: Some(text),
                        context_window: window_of(info.get("max_total_tokens")),
                    })
                }
                TokenizerApi::LlamaCpp => {
                    let rendered = self
                        .send(
                            "/apply-template",
                            Some(json!({"messages": ServerTokenizer::messages(prompt)})),
                        )
                        .await?;
                    let text = rendered
                        .get("prompt")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            RenderError("/apply-template answered no \"prompt\"".into())
                        })?
                        .to_string();
                    let ids = self.raw_tokens(&text).await?;
                    let props = self.send("/props", None).await?;
                    Ok(Chat {
                        ids,
                        text: Some(text),
                        context_window: window_of(
                            props.pointer("/default_generation_settings/n_ctx"),
                        ),
                    })
                }
            }
        })
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> TokenizerFuture<'a, Vec<u32>> {
        Box::pin(self.raw_tokens(text))
    }

    fn control_tokens(&self) -> Vec<String> {
        self.own.clone()
    }

    fn detokenize<'a>(&'a self, ids: &'a [u32]) -> TokenizerFuture<'a, String> {
        Box::pin(async move {
            if self.api == TokenizerApi::Tgi {
                let pieces = self
                    .pieces
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                return ids
                    .iter()
                    .map(|id| {
                        pieces.get(id).cloned().ok_or_else(|| {
                            RenderError(format!(
                                "TGI has no /detokenize, and no answer gave the text of id {id}"
                            ))
                        })
                    })
                    .collect();
            }
            let (body, field) = match self.api {
                TokenizerApi::Vllm => (json!({"model": self.model, "tokens": ids}), "prompt"),
                TokenizerApi::LlamaCpp => (json!({"tokens": ids}), "content"),
                TokenizerApi::Tgi => unreachable!("answered above"),
            };
            let answer = self.send("/detokenize", Some(body)).await?;
            answer
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| RenderError(format!("/detokenize answered no {field:?}")))
        })
    }
}

impl OpenAiCompatible {
    /// This provider's own tokenizer, at the same server, with the same API key and client.
    pub fn tokenizer(&self, api: TokenizerApi) -> ServerTokenizer {
        let base = self.url_for_tokenizer();
        let mut tokenizer =
            ServerTokenizer::new(&base, self.model(), api).with_client(self.http_client());
        tokenizer.api_key = self.api_key_for_tokenizer();
        tokenizer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_drop_v1_and_keep_the_query() {
        assert_eq!(root_of("http://h:8000/v1/"), ("http://h:8000".into(), None));
        assert_eq!(root_of("http://h:8000"), ("http://h:8000".into(), None));
        assert_eq!(
            root_of("https://h/x/v1?key=k#frag"),
            ("https://h/x".into(), Some("key=k".into()))
        );
        let t = ServerTokenizer::new("https://u:p@h/v1?key=s3cret", "m", TokenizerApi::Vllm);
        let shown = format!("{t:?} {}", t.describe());
        assert!(
            !shown.contains("s3cret") && !shown.contains("u:p"),
            "{shown}"
        );
    }

    #[test]
    fn ids_are_read_from_either_shape() {
        assert_eq!(ids_of(&json!({"tokens": [1, 2]})).unwrap(), vec![1, 2]);
        assert_eq!(
            ids_of(&json!({"tokens": [{"id": 7, "piece": "a"}]})).unwrap(),
            vec![7]
        );
        assert!(ids_of(&json!({"tokens": [-1]})).is_err());
        assert!(ids_of(&json!({})).is_err());
    }
}

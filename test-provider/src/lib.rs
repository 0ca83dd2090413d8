//! A local, OpenAI-compatible chat-completions server for pg_intent's contract tests: a fake
//! model that is well-behaved, or misbehaves on purpose.
//!
//! [`TestProvider::start`] binds `127.0.0.1` on a free port, in-process, and answers
//! `POST /v1/chat/completions` like an OpenAI-style API (`choices[0].message.content`). It stops
//! when dropped. Every request is recorded ([`TestProvider::requests`]) so a test can see the
//! rendered prompts and the temperature that reached it.
//!
//! The fake model knows one task, captioning a picture (the [`captions`] contract). It reads the
//! subject from the user prompt (the text after `Subject:`) and the answer's format from the
//! system prompt: the first JSON Schema written there (an object with `properties`). What it
//! does with them is its [`Mode`]:
//!
//! | mode | answers |
//! |---|---|
//! | [`Mode::WellBehaved`] | one JSON object with exactly the schema's properties, the caption naming the subject (prose if the system prompt has no schema) |
//! | [`Mode::HallucinatedKey`] | the same plus a top-level key the schema does not have (`reasoning`) |
//! | [`Mode::IgnoresFormat`] | chatty Markdown prose, whatever the system prompt asked for |
//! | [`Mode::CheckerRejects`] | schema-valid JSON whose caption does not name the subject |
//! | [`Mode::ServerError`] | HTTP 503 with `Retry-After: 1` and an OpenAI-style error body: overloaded, nothing was done |
//! | [`Mode::RateLimited`] | HTTP 429 with `Retry-After: 2`: rate-limited, nothing was done |
//! | [`Mode::BadGateway`] | HTTP 502: a gateway lost its upstream, which may have done the work |
//! | [`Mode::CutsOffBody`] | a well-behaved answer whose body stops halfway (the `Content-Length` promises more) and the connection closes |
//! | [`Mode::HangsUp`] | nothing: it reads the request, then closes the connection without an answer |
//! | [`Mode::EndlessBody`] | HTTP 200 and a chat completion whose content never ends (a body without end, sent in chunks) |
//!
//! Independently of the mode, [`TestProvider::set_delay`] makes it answer late: a slow model,
//! still generating when the client gives up. The request is recorded when it arrives, before
//! the delay.
//!
//! **Idempotency keys and status lookups** (Stripe's model). A request with an
//! `Idempotency-Key` header is kept under that key: sent again, it is not worked on again — a
//! finished one is answered as the first time (with `Idempotent-Replayed: true`), one still
//! being worked on is `409`. `GET /v1/requests/{key}` says what became of it:
//!
//! | the provider | answer |
//! |---|---|
//! | is still working on it | `200 {"id", "status": "running"}` |
//! | answered it (or its upstream did the work and only the answer was lost: [`Mode::BadGateway`]) | `200 {"id", "status": "succeeded", "response": <the chat completion>}` |
//! | refused it without doing the work (HTTP 4xx/503) | `200 {"id", "status": "failed", "http_status", "response": <the error body>}` |
//! | never received it | `404` |
//! | has forgotten it ([`TestProvider::forget`]: its records expired) | `410`: nobody can tell |
//!
//! [`TestProvider::lookups`] lists the keys asked about, in order.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use pg_intent_test_provider::{Mode, TestProvider};
//! let provider = TestProvider::start(Mode::WellBehaved).await?;
//! println!("POST {}/v1/chat/completions", provider.base_url());
//! provider.set_mode(Mode::HallucinatedKey); // the provider drifts
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod tokenizer;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// The largest request body accepted (1 MiB).
const MAX_BODY: usize = 1 << 20;

/// How the fake model behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Follows the system prompt's format: one JSON object with exactly the schema's properties,
    /// whose caption names the subject.
    WellBehaved,
    /// Follows the format but adds a top-level key the schema does not have (`reasoning`).
    HallucinatedKey,
    /// Ignores the system prompt's format: answers in Markdown prose.
    IgnoresFormat,
    /// Schema-valid JSON that business logic cannot use: the caption does not name the subject,
    /// so the contract's checker rejects it.
    CheckerRejects,
    /// Answers HTTP 503 (overloaded) with `Retry-After: 1` to every request: a deliberate
    /// refusal, before any work.
    ServerError,
    /// Answers HTTP 429 (rate-limited) with `Retry-After: 2` to every request.
    RateLimited,
    /// Answers HTTP 502 (bad gateway) to every request: what a proxy says when its upstream
    /// failed, possibly after doing the work.
    BadGateway,
    /// Starts a well-behaved answer, then closes the connection halfway through the body.
    CutsOffBody,
    /// Reads the request, then closes the connection without answering.
    HangsUp,
    /// Answers HTTP 200 with a body that never ends.
    EndlessBody,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 10] = [
        Mode::WellBehaved,
        Mode::HallucinatedKey,
        Mode::IgnoresFormat,
        Mode::CheckerRejects,
        Mode::ServerError,
        Mode::RateLimited,
        Mode::BadGateway,
        Mode::CutsOffBody,
        Mode::HangsUp,
        Mode::EndlessBody,
    ];

    /// The mode's name on the command line: `well-behaved`, `hallucinated-key`, ….
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::WellBehaved => "well-behaved",
            Mode::HallucinatedKey => "hallucinated-key",
            Mode::IgnoresFormat => "ignores-format",
            Mode::CheckerRejects => "checker-rejects",
            Mode::ServerError => "server-error",
            Mode::RateLimited => "rate-limited",
            Mode::BadGateway => "bad-gateway",
            Mode::CutsOffBody => "cuts-off-body",
            Mode::HangsUp => "hangs-up",
            Mode::EndlessBody => "endless-body",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Mode::ALL.iter().map(|m| m.as_str()).collect();
                format!("unknown mode {s:?} (one of: {})", names.join(", "))
            })
    }
}

/// A chat-completions request as the server received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// `model`.
    pub model: Option<String>,
    /// The system messages' text, joined by newlines.
    pub system: String,
    /// The user messages' text, joined by newlines.
    pub user: String,
    /// `temperature`, if sent.
    pub temperature: Option<f64>,
    /// `max_tokens` (or `max_completion_tokens`), if sent.
    pub max_tokens: Option<u64>,
    /// Whether an `Authorization` header was sent (its value is never kept).
    pub authorized: bool,
    /// The `Idempotency-Key` header, if sent.
    pub idempotency_key: Option<String>,
    /// Whether it was answered from the record of an earlier request with the same key (no
    /// work done).
    pub replayed: bool,
    /// The whole request body.
    pub body: Value,
}

/// What the fake model answers: the assistant message's text, or an HTTP error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `choices[0].message.content`.
    Content(String),
    /// The chat completion of this content, but its body stops halfway and the connection
    /// closes.
    CutOff(String),
    /// No answer: the connection closes.
    HangUp,
    /// A chat completion whose content never ends.
    Endless,
    /// An HTTP error status and its message.
    Error {
        /// The HTTP status.
        status: u16,
        /// The OpenAI-style error message.
        message: String,
        /// The `Retry-After` header (seconds), if sent.
        retry_after: Option<u64>,
    },
}

/// What the provider keeps of a request sent with an idempotency key.
#[derive(Debug, Clone)]
enum Record {
    /// Being worked on.
    Running,
    /// Answered: the status, the body and the `Retry-After` it was answered with, and whether
    /// the work was done (`false`: refused before any work).
    Answered {
        status: u16,
        body: Value,
        retry_after: Option<u64>,
        done: bool,
    },
}

struct State {
    mode: Mutex<Mode>,
    delay: Mutex<Duration>,
    lookup_delay: Mutex<Duration>,
    requests: Mutex<Vec<Received>>,
    records: Mutex<HashMap<String, Record>>,
    forgotten: Mutex<HashSet<String>>,
    lookups: Mutex<Vec<String>>,
    served: AtomicU64,
    /// The tokenizer endpoints' tokenizer (trained at the first request unless set).
    tokenizer: Mutex<Option<Arc<tokenizer::ProviderTokenizer>>>,
    flaws: Mutex<Vec<tokenizer::Flaw>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running test provider on `127.0.0.1`; it stops (with its open connections) when dropped.
pub struct TestProvider {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl fmt::Debug for TestProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestProvider")
            .field("addr", &self.addr)
            .field("mode", &self.mode())
            .finish_non_exhaustive()
    }
}

impl TestProvider {
    /// Starts a provider in `mode` on `127.0.0.1`, on a free port, on the current tokio runtime.
    pub async fn start(mode: Mode) -> std::io::Result<TestProvider> {
        TestProvider::bind(SocketAddr::from(([127, 0, 0, 1], 0)), mode).await
    }

    /// Starts a provider in `mode` on `addr` (port 0: a free one).
    pub async fn bind(addr: SocketAddr, mode: Mode) -> std::io::Result<TestProvider> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            mode: Mutex::new(mode),
            delay: Mutex::new(Duration::ZERO),
            lookup_delay: Mutex::new(Duration::ZERO),
            requests: Mutex::new(Vec::new()),
            records: Mutex::new(HashMap::new()),
            forgotten: Mutex::new(HashSet::new()),
            lookups: Mutex::new(Vec::new()),
            served: AtomicU64::new(0),
            tokenizer: Mutex::new(None),
            flaws: Mutex::new(Vec::new()),
        });
        let task = tokio::spawn(accept(listener, state.clone()));
        Ok(TestProvider { addr, state, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`: the base URL an OpenAI-compatible client is given (it posts to
    /// `{base_url}/v1/chat/completions`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self
            .state
            .mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes its tokenizer endpoints ([`tokenizer`]) answer with `flaws` from now on (none:
    /// well-behaved).
    pub fn set_flaws(&self, flaws: &[tokenizer::Flaw]) {
        *locked(&self.state.flaws) = flaws.to_vec();
    }

    /// The flaws its tokenizer endpoints have.
    pub fn flaws(&self) -> Vec<tokenizer::Flaw> {
        locked(&self.state.flaws).clone()
    }

    /// Uses `tokenizer` for its tokenizer endpoints (default: [`tokenizer::tiny_tokenizer`]'s).
    pub fn set_tokenizer(&self, tokenizer: tokenizer::ProviderTokenizer) {
        *locked(&self.state.tokenizer) = Some(Arc::new(tokenizer));
    }

    /// Changes the mode for the next requests: a provider that drifts after certification.
    pub fn set_mode(&self, mode: Mode) {
        *self
            .state
            .mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = mode;
    }

    /// Answers every next request only `delay` after it arrived (zero: at once): a slow model.
    /// The request is recorded on arrival, so [`TestProvider::requests`] shows it while the
    /// answer is still to come.
    pub fn set_delay(&self, delay: Duration) {
        *self
            .state
            .delay
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = delay;
    }

    /// The chat-completions requests received so far, in order.
    pub fn requests(&self) -> Vec<Received> {
        self.state
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Forgets the request kept under `key`, as a provider whose records expired: its lookup
    /// answers `410` (nobody can tell) from now on, and a request sent again with the key is a
    /// new one.
    pub fn forget(&self, key: &str) {
        locked(&self.state.records).remove(key);
        locked(&self.state.forgotten).insert(key.to_string());
    }

    /// Answers every next status lookup only `delay` after it arrived (zero: at once).
    pub fn set_lookup_delay(&self, delay: Duration) {
        *locked(&self.state.lookup_delay) = delay;
    }

    /// What `GET /v1/requests/{key}` would say of `key` (`running`, `succeeded`, `failed`,
    /// `expired` or `None`: never received), without counting as a lookup.
    pub fn request_status(&self, key: &str) -> Option<&'static str> {
        match locked(&self.state.records).get(key) {
            Some(Record::Running) => Some("running"),
            Some(Record::Answered { done: true, .. }) => Some("succeeded"),
            Some(Record::Answered { done: false, .. }) => Some("failed"),
            None if locked(&self.state.forgotten).contains(key) => Some("expired"),
            None => None,
        }
    }

    /// The keys `GET /v1/requests/{key}` asked about so far, in order.
    pub fn lookups(&self) -> Vec<String> {
        locked(&self.state.lookups).clone()
    }
}

impl Drop for TestProvider {
    fn drop(&mut self) {
        // Dropping the accept loop drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(state.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A response body: whole, cut off halfway, or without end.
enum Reply {
    /// The whole body (taken when sent).
    Full(Option<Bytes>),
    /// The first part of a body of `len` bytes, a pause (so that it is sent), then an error:
    /// hyper closes the connection. Without a head, the error comes first and hyper closes the
    /// connection before the response's head is sent.
    CutOff {
        head: Option<Bytes>,
        len: u64,
        pause: Option<Pin<Box<tokio::time::Sleep>>>,
    },
    /// The start of a chat completion, then content forever.
    Endless { head: Option<Bytes> },
}

/// One chunk of [`Reply::Endless`]'s content.
const ENDLESS_CHUNK: &[u8] = &[b'x'; 16 * 1024];

impl Body for Reply {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(match self.get_mut() {
            Reply::Full(body) => body.take().map(|b| Ok(Frame::data(b))),
            Reply::CutOff { head, pause, .. } => {
                if let Some(h) = head.take() {
                    return Poll::Ready(Some(Ok(Frame::data(h))));
                }
                if let Some(p) = pause {
                    std::task::ready!(p.as_mut().poll(cx));
                }
                Some(Err(std::io::Error::other(
                    "the test provider cuts the body off",
                )))
            }
            Reply::Endless { head } => Some(Ok(Frame::data(
                head.take()
                    .unwrap_or_else(|| Bytes::from_static(ENDLESS_CHUNK)),
            ))),
        })
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Reply::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Reply::Full(body) => SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64)),
            Reply::CutOff { len, .. } => SizeHint::with_exact(*len),
            Reply::Endless { .. } => SizeHint::default(),
        }
    }
}

fn respond(status: StatusCode, body: &Value) -> Response<Reply> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Reply::Full(Some(Bytes::from(body.to_string()))))
        .expect("a valid response")
}

fn error_body(message: &str, kind: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

/// `GET /v1/requests/{key}`: what became of the request kept under `key`.
/// The tokenizer endpoints ([`tokenizer::answer`]): `GET /props` and `/info`, `POST` the
/// others.
async fn tokenizer_route(
    state: &State,
    path: &str,
    method: Method,
    body: Incoming,
) -> Response<Reply> {
    let wanted = if path == "/props" || path == "/info" {
        Method::GET
    } else {
        Method::POST
    };
    if method != wanted {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            &error_body(&format!("use {wanted}"), "invalid_request_error"),
        );
    }
    let body = if wanted == Method::POST {
        let bytes = match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                return respond(
                    StatusCode::BAD_REQUEST,
                    &error_body(
                        &format!("could not read the body: {e}"),
                        "invalid_request_error",
                    ),
                );
            }
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => v,
            Err(e) => {
                return respond(
                    StatusCode::BAD_REQUEST,
                    &error_body(
                        &format!("the body is not JSON: {e}"),
                        "invalid_request_error",
                    ),
                );
            }
        }
    } else {
        Value::Null
    };
    let tokenizer = {
        let mut slot = locked(&state.tokenizer);
        slot.get_or_insert_with(|| Arc::new(tokenizer::ProviderTokenizer::default()))
            .clone()
    };
    let flaws = locked(&state.flaws).clone();
    match tokenizer::answer(&tokenizer, path, &body, &flaws) {
        Ok(answer) => respond(StatusCode::OK, &answer),
        Err(message) => respond(
            StatusCode::BAD_REQUEST,
            &error_body(&message, "invalid_request_error"),
        ),
    }
}

async fn lookup(state: &State, key: &str) -> Response<Reply> {
    locked(&state.lookups).push(key.to_string());
    let delay = *locked(&state.lookup_delay);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let record = locked(&state.records).get(key).cloned();
    match record {
        Some(Record::Running) => respond(StatusCode::OK, &json!({"id": key, "status": "running"})),
        Some(Record::Answered {
            status, body, done, ..
        }) => {
            let mut answer = json!({"id": key, "response": body});
            if done {
                answer["status"] = json!("succeeded");
            } else {
                answer["status"] = json!("failed");
                answer["http_status"] = json!(status);
            }
            respond(StatusCode::OK, &answer)
        }
        None if locked(&state.forgotten).contains(key) => respond(
            StatusCode::GONE,
            &error_body(
                "the record of this request has expired: whether it was done cannot be told",
                "expired",
            ),
        ),
        None => respond(
            StatusCode::NOT_FOUND,
            &error_body(
                "no request was received with this idempotency key",
                "not_found",
            ),
        ),
    }
}

/// A chat completion of `content`, the `n`th answer of the server.
fn completion_body(n: u64, model: &str, prompt_chars: usize, content: &str) -> Value {
    let completion_chars = content.chars().count();
    json!({
        "id": format!("chatcmpl-test-{n}"),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop"
        }],
        "usage": {
            "prompt_tokens": prompt_chars / 4,
            "completion_tokens": completion_chars / 4,
            "total_tokens": (prompt_chars + completion_chars) / 4
        }
    })
}

/// The answer kept under an idempotency key, sent again.
fn replay(status: u16, body: &Value, retry_after: Option<u64>) -> Response<Reply> {
    let mut response = respond(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body,
    );
    response.headers_mut().insert(
        hyper::header::HeaderName::from_static("idempotent-replayed"),
        hyper::header::HeaderValue::from_static("true"),
    );
    if let Some(secs) = retry_after {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, secs.into());
    }
    response
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Reply>, Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().trim_end_matches('/');
    if let Some(key) = path.strip_prefix("/v1/requests/") {
        if parts.method != Method::GET {
            return Ok(respond(
                StatusCode::METHOD_NOT_ALLOWED,
                &error_body("use GET", "invalid_request_error"),
            ));
        }
        return Ok(lookup(&state, key).await);
    }
    if matches!(
        path,
        "/tokenize" | "/detokenize" | "/apply-template" | "/props" | "/chat_tokenize" | "/info"
    ) {
        return Ok(tokenizer_route(&state, path, parts.method, body).await);
    }
    if path != "/v1/chat/completions" {
        let message = format!("no route for {}", parts.uri.path());
        return Ok(respond(
            StatusCode::NOT_FOUND,
            &error_body(&message, "invalid_request_error"),
        ));
    }
    if parts.method != Method::POST {
        return Ok(respond(
            StatusCode::METHOD_NOT_ALLOWED,
            &error_body("use POST", "invalid_request_error"),
        ));
    }
    let bytes = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return Ok(respond(
                StatusCode::BAD_REQUEST,
                &error_body(
                    &format!("could not read the body: {e}"),
                    "invalid_request_error",
                ),
            ));
        }
    };
    let authorized = parts.headers.contains_key(hyper::header::AUTHORIZATION);
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut received = match serde_json::from_slice::<Value>(&bytes)
        .map_err(|e| format!("the body is not JSON: {e}"))
        .and_then(|body| Received::from_body(body, authorized))
    {
        Ok(r) => r,
        Err(message) => {
            return Ok(respond(
                StatusCode::BAD_REQUEST,
                &error_body(&message, "invalid_request_error"),
            ));
        }
    };
    received.idempotency_key = key.clone();
    // A key seen before: no new work. Taken and marked under one lock, so that two requests
    // with the same key at once do the work once.
    if let Some(key) = &key {
        let mut records = locked(&state.records);
        if let Some(record) = records.get(key).cloned() {
            drop(records);
            received.replayed = true;
            locked(&state.requests).push(received);
            return Ok(match record {
                Record::Running => respond(
                    StatusCode::CONFLICT,
                    &error_body(
                        "a request with this idempotency key is still being processed",
                        "idempotency_error",
                    ),
                ),
                Record::Answered {
                    status,
                    body,
                    retry_after,
                    ..
                } => replay(status, &body, retry_after),
            });
        }
        records.insert(key.clone(), Record::Running);
        locked(&state.forgotten).remove(key);
    }
    let mode = *state.mode.lock().unwrap_or_else(PoisonError::into_inner);
    let answer = answer(mode, &received.system, &received.user);
    // What the record says once answered: a bad gateway lost the answer of work its upstream
    // did (a well-behaved one); hanging up or answering without end never finishes.
    let kept = match (&answer, mode) {
        (_, Mode::BadGateway) => {
            match self::answer(Mode::WellBehaved, &received.system, &received.user) {
                Answer::Content(c) => Some(Ok(c)),
                _ => None,
            }
        }
        (Answer::Content(c) | Answer::CutOff(c), _) => Some(Ok(c.clone())),
        (
            Answer::Error {
                status,
                message,
                retry_after,
            },
            _,
        ) => Some(Err((
            *status,
            error_body(message, "server_error"),
            *retry_after,
        ))),
        (Answer::HangUp | Answer::Endless, _) => None,
    };
    let model = received.model.clone().unwrap_or_else(|| "fake".into());
    let prompt_chars = received.system.chars().count() + received.user.chars().count();
    state
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(received);
    let n = state.served.fetch_add(1, Ordering::Relaxed) + 1;
    let delay = *state.delay.lock().unwrap_or_else(PoisonError::into_inner);
    let completion = move |content: &str| completion_body(n, &model, prompt_chars, content);
    // The work, in a task of its own: a client that gives up (closes the connection) does not
    // stop the model, which finishes and keeps its answer under the key.
    let work = {
        let state = state.clone();
        let completion = completion.clone();
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let (Some(key), Some(kept)) = (key, kept) else {
                return;
            };
            let record = match kept {
                Ok(content) => Record::Answered {
                    status: 200,
                    body: completion(&content),
                    retry_after: None,
                    done: true,
                },
                Err((status, body, retry_after)) => Record::Answered {
                    status,
                    body,
                    retry_after,
                    done: false,
                },
            };
            // Unless it was forgotten meanwhile.
            if let Some(r) = locked(&state.records).get_mut(&key) {
                *r = record;
            }
        })
    };
    let _ = work.await;
    Ok(match answer {
        Answer::Content(content) => respond(StatusCode::OK, &completion(&content)),
        Answer::CutOff(content) => {
            let whole = Bytes::from(completion(&content).to_string());
            let len = whole.len() as u64;
            let mut response = respond(StatusCode::OK, &Value::Null);
            *response.body_mut() = Reply::CutOff {
                head: Some(whole.slice(..whole.len() / 2)),
                len,
                pause: Some(Box::pin(tokio::time::sleep(Duration::from_millis(50)))),
            };
            response
        }
        Answer::HangUp => {
            let mut response = respond(StatusCode::OK, &Value::Null);
            *response.body_mut() = Reply::CutOff {
                head: None,
                len: 1,
                pause: None,
            };
            response
        }
        Answer::Endless => {
            let mut response = respond(StatusCode::OK, &Value::Null);
            let head = format!(
                "{{\"id\": \"chatcmpl-test-{n}\", \"object\": \"chat.completion\", \"choices\": [{{\"index\": 0, \"message\": {{\"role\": \"assistant\", \"content\": \""
            );
            *response.body_mut() = Reply::Endless {
                head: Some(Bytes::from(head)),
            };
            response
        }
        Answer::Error {
            status,
            message,
            retry_after,
        } => {
            let mut response = respond(
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                &error_body(&message, "server_error"),
            );
            if let Some(secs) = retry_after {
                response
                    .headers_mut()
                    .insert(hyper::header::RETRY_AFTER, secs.into());
            }
            response
        }
    })
}

impl Received {
    fn from_body(body: Value, authorized: bool) -> Result<Received, String> {
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .ok_or("messages must be an array")?;
        let mut system = Vec::new();
        let mut user = Vec::new();
        for m in messages {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or("a message has no role")?;
            let text = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                // The array form: [{"type": "text", "text": "…"}, …].
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => return Err(format!("a {role} message has no content")),
            };
            match role {
                "system" | "developer" => system.push(text),
                "user" => user.push(text),
                _ => {}
            }
        }
        Ok(Received {
            model: body
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_string),
            system: system.join("\n"),
            user: user.join("\n"),
            temperature: body.get("temperature").and_then(Value::as_f64),
            max_tokens: body
                .get("max_tokens")
                .or_else(|| body.get("max_completion_tokens"))
                .and_then(Value::as_u64),
            authorized,
            idempotency_key: None,
            replayed: false,
            body,
        })
    }
}

/// What the fake model answers in `mode` to a system and a user prompt (the server's whole
/// behaviour, without the HTTP).
pub fn answer(mode: Mode, system: &str, user: &str) -> Answer {
    let subject = subject_of(user);
    let schema = schema_in(system);
    let naming = format!("A photo of {subject}.");
    match (mode, schema) {
        (Mode::ServerError, _) => Answer::Error {
            status: 503,
            message: "the model is overloaded".into(),
            retry_after: Some(1),
        },
        (Mode::RateLimited, _) => Answer::Error {
            status: 429,
            message: "rate limit reached for requests".into(),
            retry_after: Some(2),
        },
        (Mode::BadGateway, _) => Answer::Error {
            status: 502,
            message: "upstream connect error or disconnect/reset before headers".into(),
            retry_after: None,
        },
        (Mode::EndlessBody, _) => Answer::Endless,
        (Mode::HangsUp, _) => Answer::HangUp,
        (Mode::IgnoresFormat, _) | (_, None) => Answer::Content(format!(
            "Sure! Here is a caption for **{subject}**:\n\n> {naming}\n\nLet me know if you would like another one."
        )),
        (Mode::WellBehaved, Some(schema)) => {
            Answer::Content(Value::Object(instance(&schema, &subject, &naming)).to_string())
        }
        (Mode::CutsOffBody, Some(schema)) => {
            Answer::CutOff(Value::Object(instance(&schema, &subject, &naming)).to_string())
        }
        (Mode::HallucinatedKey, Some(schema)) => {
            let mut object = instance(&schema, &subject, &naming);
            object.insert(
                "reasoning".into(),
                json!(format!(
                    "The user asked about {subject}, so the caption names it."
                )),
            );
            Answer::Content(Value::Object(object).to_string())
        }
        (Mode::CheckerRejects, Some(schema)) => Answer::Content(
            Value::Object(instance(
                &schema,
                &subject,
                "A lovely picture, full of atmosphere.",
            ))
            .to_string(),
        ),
    }
}

/// The subject: the text after the last `Subject:` of the user prompt, else the whole prompt.
fn subject_of(user: &str) -> String {
    user.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Subject:"))
        .unwrap_or(user)
        .trim()
        .to_string()
}

/// The first JSON object with `properties` written in the system prompt.
fn schema_in(system: &str) -> Option<Value> {
    system
        .char_indices()
        .filter(|&(_, c)| c == '{')
        .find_map(|(i, _)| {
            let value = serde_json::Deserializer::from_str(&system[i..])
                .into_iter::<Value>()
                .next()?
                .ok()?;
            value
                .get("properties")
                .is_some_and(Value::is_object)
                .then_some(value)
        })
}

/// An object with exactly the schema's properties: `subject` and `caption` as given, the
/// others a plausible value of their type.
fn instance(schema: &Value, subject: &str, caption: &str) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return out;
    };
    for (name, property) in properties {
        let value = match name.as_str() {
            "subject" => json!(subject),
            "caption" => json!(caption),
            _ => plausible(property, subject),
        };
        out.insert(name.clone(), value);
    }
    out
}

fn plausible(property: &Value, subject: &str) -> Value {
    if let Some(c) = property.get("const") {
        return c.clone();
    }
    if let Some(first) = property
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    let ty = match property.get("type") {
        Some(Value::Array(types)) => types.first().and_then(Value::as_str),
        Some(t) => t.as_str(),
        None => None,
    };
    let min = property.get("minimum").and_then(Value::as_f64);
    let max = property.get("maximum").and_then(Value::as_f64);
    match ty {
        Some("number") => {
            let lo = min.unwrap_or(0.0);
            let hi = max.unwrap_or(lo + 1.0);
            json!(lo + 0.9 * (hi - lo))
        }
        Some("integer") => json!(min.map_or(1, |m| m.ceil() as i64)),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => json!({}),
        Some("null") => Value::Null,
        _ => json!(subject),
    }
}

/// The contract the fake model's task is tested against: captions that must name their
/// subject. Shared by the client's tests and the demo.
pub mod captions {
    use serde_json::{Value, json};

    /// The contract's name.
    pub const CONTRACT: &str = "captions-v1";

    /// The checker's signature, as `intent.define_contract` takes it.
    pub const CHECKER: &str = "public.caption_mentions_subject(jsonb)";

    /// Creates the checker: business logic can only use a caption that names its subject. It
    /// lives in `public`, which `intent_owner` (the role checkers run as) may use.
    pub const CHECKER_SQL: &str = "\
CREATE OR REPLACE FUNCTION public.caption_mentions_subject(result jsonb) RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT strpos(lower(result->>'caption'), lower(result->>'subject')) > 0 $$;
COMMENT ON FUNCTION public.caption_mentions_subject(jsonb) IS
  'Checker of contract captions-v1: the caption must name its subject.';";

    /// The subjects of the contract-test suite.
    pub const SUBJECTS: [&str; 5] = [
        "a red fox in the snow",
        "the Eiffel Tower at night",
        "two cats asleep on a sofa",
        "ein Fahrrad im Regen",
        "a bowl of ramen",
    ];

    /// The output schema: exactly `subject`, `caption` and `confidence`, nothing else.
    pub fn schema() -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["subject", "caption", "confidence"],
            "properties": {
                "subject": {"type": "string", "minLength": 1, "maxLength": 200},
                "caption": {"type": "string", "minLength": 1, "maxLength": 500},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1}
            }
        })
    }

    /// A job's params (and a test case's input): `{"subject": …}`.
    pub fn input(subject: &str) -> Value {
        json!({ "subject": subject })
    }

    /// The system prompt: the task, and the format as the contract's JSON Schema.
    pub fn system_prompt() -> String {
        format!(
            "You write captions for pictures.\n\
             Answer with exactly one JSON object and nothing else: no prose, no Markdown, no code fences.\n\
             It must validate against this JSON Schema (draft 2020-12):\n{}\n\
             The caption is one sentence that names the subject.",
            schema()
        )
    }

    /// The user prompt for one input (`{"subject": …}`).
    pub fn user_prompt(input: &Value) -> String {
        let subject = input.get("subject").and_then(Value::as_str).unwrap_or("");
        format!("Caption this picture.\nSubject: {subject}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(a: Answer) -> Value {
        match a {
            Answer::Content(c) => serde_json::from_str(&c).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_mode_answers_as_documented() {
        let system = captions::system_prompt();
        let user = captions::user_prompt(&captions::input("a red fox"));
        let good = parsed(answer(Mode::WellBehaved, &system, &user));
        assert_eq!(
            good,
            json!({"subject": "a red fox", "caption": "A photo of a red fox.", "confidence": 0.9})
        );
        let extra = parsed(answer(Mode::HallucinatedKey, &system, &user));
        assert!(extra.get("reasoning").is_some());
        assert_eq!(extra.as_object().unwrap().len(), 4);
        let Answer::Content(prose) = answer(Mode::IgnoresFormat, &system, &user) else {
            panic!()
        };
        assert!(serde_json::from_str::<Value>(&prose).is_err(), "{prose}");
        let lazy = parsed(answer(Mode::CheckerRejects, &system, &user));
        assert!(!lazy["caption"].as_str().unwrap().contains("red fox"));
        assert_eq!(lazy["subject"], "a red fox");
        assert!(matches!(
            answer(Mode::ServerError, &system, &user),
            Answer::Error {
                status: 503,
                retry_after: Some(1),
                ..
            }
        ));
        assert!(matches!(
            answer(Mode::RateLimited, &system, &user),
            Answer::Error {
                status: 429,
                retry_after: Some(2),
                ..
            }
        ));
        assert!(matches!(
            answer(Mode::BadGateway, &system, &user),
            Answer::Error {
                status: 502,
                retry_after: None,
                ..
            }
        ));
        assert!(matches!(
            answer(Mode::CutsOffBody, &system, &user),
            Answer::CutOff(c) if c.contains("red fox")
        ));
        assert_eq!(answer(Mode::EndlessBody, &system, &user), Answer::Endless);
        assert_eq!(answer(Mode::HangsUp, &system, &user), Answer::HangUp);
        // No format asked for: even a well-behaved model answers in prose.
        let Answer::Content(prose) = answer(Mode::WellBehaved, "Be helpful.", &user) else {
            panic!()
        };
        assert!(prose.contains("a red fox"));
    }

    #[test]
    fn modes_parse_by_name() {
        for m in Mode::ALL {
            assert_eq!(m.as_str().parse::<Mode>().unwrap(), m);
        }
        assert!("polite".parse::<Mode>().is_err());
    }
}

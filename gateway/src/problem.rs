//! Errors as `application/problem+json` (RFC 9457), carrying the SQLSTATE when the database
//! refused.
//!
//! ```json
//! {"type": "/problems/idempotency-key-reused", "title": "Idempotency-Key reused with another request",
//!  "status": 422, "detail": "Job … exists with a different params.", "sqlstate": "IJ001", "job_id": "…"}
//! ```
//!
//! Each `type` is a path of the gateway: `GET /problems/{slug}` says what it means and what to do.

use axum::Json;
use axum::http::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use pg_intent_client::Error;
use serde_json::{Map, Value, json};
use uuid::Uuid;

/// The kinds of problem the gateway answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 401: no or an unknown bearer token.
    Unauthorized,
    /// 400: the request has no `Idempotency-Key`.
    KeyMissing,
    /// 400: the `Idempotency-Key` is not one quoted string of 1–255 characters.
    KeyMalformed,
    /// 422: the key was used before for another request (`IJ001`).
    KeyReused,
    /// 409: the job of this key is pending or running.
    InFlight,
    /// 409: the outcome of the job's attempt is unknown; someone must reconcile it.
    OutcomeUnknown,
    /// 400: the body is not JSON, or the database refused the input (`22xxx`).
    InvalidRequest,
    /// 400: a header that must appear once (`Authorization`, `Content-Type`) appears several
    /// times.
    HeaderRepeated,
    /// 413: the body is larger than the gateway reads.
    PayloadTooLarge,
    /// 408: the body did not arrive within the body timeout.
    RequestTimeout,
    /// 415: the body is not `application/json`.
    UnsupportedMediaType,
    /// 404: no such job (for this owner), or no such provider.
    NotFound,
    /// 403: the database refused the owner binding (`42501`).
    Forbidden,
    /// 503: the database is unreachable, did not answer in time, or asked for a retry later (a
    /// transient SQLSTATE: `pg_intent_protocol::sqlstate::is_transient`).
    Unavailable,
    /// 500: anything else.
    Internal,
}

impl Kind {
    /// Every kind, for the `/problems` pages.
    pub const ALL: [Kind; 15] = [
        Kind::Unauthorized,
        Kind::KeyMissing,
        Kind::KeyMalformed,
        Kind::KeyReused,
        Kind::InFlight,
        Kind::OutcomeUnknown,
        Kind::InvalidRequest,
        Kind::HeaderRepeated,
        Kind::PayloadTooLarge,
        Kind::RequestTimeout,
        Kind::UnsupportedMediaType,
        Kind::NotFound,
        Kind::Forbidden,
        Kind::Unavailable,
        Kind::Internal,
    ];

    /// The last segment of its `type`.
    pub fn slug(self) -> &'static str {
        match self {
            Kind::Unauthorized => "unauthorized",
            Kind::KeyMissing => "idempotency-key-missing",
            Kind::KeyMalformed => "idempotency-key-malformed",
            Kind::KeyReused => "idempotency-key-reused",
            Kind::InFlight => "request-in-flight",
            Kind::OutcomeUnknown => "outcome-unknown",
            Kind::InvalidRequest => "invalid-request",
            Kind::HeaderRepeated => "header-repeated",
            Kind::PayloadTooLarge => "payload-too-large",
            Kind::RequestTimeout => "request-timeout",
            Kind::UnsupportedMediaType => "unsupported-media-type",
            Kind::NotFound => "not-found",
            Kind::Forbidden => "forbidden",
            Kind::Unavailable => "unavailable",
            Kind::Internal => "internal",
        }
    }

    /// Its HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Kind::Unauthorized => StatusCode::UNAUTHORIZED,
            Kind::KeyMissing | Kind::KeyMalformed | Kind::InvalidRequest | Kind::HeaderRepeated => {
                StatusCode::BAD_REQUEST
            }
            Kind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Kind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Kind::InFlight | Kind::OutcomeUnknown => StatusCode::CONFLICT,
            Kind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::Forbidden => StatusCode::FORBIDDEN,
            Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Its `title`: the same for every occurrence.
    pub fn title(self) -> &'static str {
        match self {
            Kind::Unauthorized => "Authentication required",
            Kind::KeyMissing => "Idempotency-Key is missing",
            Kind::KeyMalformed => "Idempotency-Key is malformed",
            Kind::KeyReused => "Idempotency-Key reused with another request",
            Kind::InFlight => "A request with this Idempotency-Key is still being processed",
            Kind::OutcomeUnknown => {
                "The outcome of the request with this Idempotency-Key is unknown"
            }
            Kind::InvalidRequest => "Invalid request",
            Kind::HeaderRepeated => "A header that must appear once appears several times",
            Kind::PayloadTooLarge => "The request body is too large",
            Kind::RequestTimeout => "The request body did not arrive in time",
            Kind::UnsupportedMediaType => "The body must be application/json",
            Kind::NotFound => "Not found",
            Kind::Forbidden => "Forbidden",
            Kind::Unavailable => "Service unavailable",
            Kind::Internal => "Internal error",
        }
    }

    /// What it means and what to do: the page at its `type`.
    pub fn explanation(self) -> &'static str {
        match self {
            Kind::Unauthorized => {
                "Send `Authorization: Bearer <token>`. The token names the owner of every job the request creates or reads."
            }
            Kind::KeyMissing => {
                "POST requests that create a job require an Idempotency-Key header: a quoted string you choose once per intent and send again, unchanged, on every retry of it. Example: Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"."
            }
            Kind::KeyMalformed => {
                "The Idempotency-Key is a Structured Field String (RFC 9651): printable ASCII in double quotes, with \\\" and \\\\ as the only escapes, 1 to 255 characters, sent once. A bare token, a number or several header lines are refused."
            }
            Kind::KeyReused => {
                "This key was already used, by the same owner, for a request with another body or another provider. A key names one intent: use a new key for a new request. The job of the first request is unchanged (SQLSTATE IJ001)."
            }
            Kind::InFlight => {
                "The first request with this key is still being processed. Retry the same request after Retry-After seconds, or follow Location to watch the job; it will not run twice."
            }
            Kind::OutcomeUnknown => {
                "The provider was asked but did not answer in time: it may still have done the work. No new attempt starts until an operator finds out what happened (docs/runbook.md). Retry later with the same key; do not switch to a new key, which would run the work again."
            }
            Kind::InvalidRequest => {
                "The request body must be JSON (at most 1 MiB once stored), and the database refused nothing else. The detail and, when present, the SQLSTATE say what."
            }
            Kind::HeaderRepeated => {
                "Send Authorization and Content-Type once each. With two Authorization headers the gateway cannot know who is asking, so it refuses rather than pick one."
            }
            Kind::PayloadTooLarge => {
                "The gateway reads request bodies up to a configured size (2 MiB by default); the database stores params up to 1 MiB. Send a smaller body."
            }
            Kind::RequestTimeout => {
                "The body did not arrive within the gateway's body timeout, and the connection was closed. Nothing was written: send the same request again, with the same Idempotency-Key."
            }
            Kind::UnsupportedMediaType => "Send the body as Content-Type: application/json.",
            Kind::NotFound => {
                "There is no such job for the authenticated owner, or no such provider."
            }
            Kind::Forbidden => "The database refused to act for this owner (SQLSTATE 42501).",
            Kind::Unavailable => {
                "The database is unreachable, did not answer in time, or asked for a retry later (a terminated connection, a cancelled statement, a lock timeout, too many connections, a serialization failure). Whether or not the job was created, it is safe to send the same request again, with the same Idempotency-Key, after Retry-After seconds: the key makes it one job."
            }
            Kind::Internal => "Something unexpected went wrong; the SQLSTATE, if any, says where.",
        }
    }

    /// The kind named by a slug.
    pub fn from_slug(slug: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.slug() == slug)
    }
}

/// An error response.
#[derive(Debug, Clone)]
pub struct Problem {
    /// What kind.
    pub kind: Kind,
    /// What happened, for this request.
    pub detail: String,
    /// Extension members (`sqlstate`, `hint`, `job_id`, `state`).
    pub extra: Map<String, Value>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u32>,
    /// `Location` (of the job).
    pub location: Option<String>,
}

impl Problem {
    /// A problem of `kind` with a detail.
    pub fn new(kind: Kind, detail: impl Into<String>) -> Problem {
        Problem {
            kind,
            detail: detail.into(),
            extra: Map::new(),
            retry_after: None,
            location: None,
        }
    }

    /// Adds an extension member.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Problem {
        self.extra.insert(name.to_string(), value.into());
        self
    }

    /// Names the job (member `job_id` and `Location`).
    pub fn job(self, job_id: Uuid) -> Problem {
        let mut p = self.with("job_id", job_id.to_string());
        p.location = Some(crate::job_location(job_id));
        p
    }

    /// Sets `Retry-After`.
    pub fn retry_after(mut self, seconds: u32) -> Problem {
        self.retry_after = Some(seconds);
        self
    }
}

/// `Retry-After` of a `503`, in seconds, unless the gateway's configuration says otherwise
/// (`Config::unavailable_retry_after`).
pub const UNAVAILABLE_RETRY_AFTER: u32 = 2;

impl From<Error> for Problem {
    fn from(e: Error) -> Problem {
        let kind = match &e {
            Error::IdempotencyConflict { .. } => Kind::KeyReused,
            Error::NotFound { .. } => Kind::NotFound,
            Error::Connection { .. } => Kind::Unavailable,
            _ if e.is_retryable() => Kind::Unavailable,
            // The shared table: 503 for every transient SQLSTATE (57P01, 57014, 55P03, 08, 53,
            // 40P01 …), whichever call it interrupted.
            _ => match e.http_status() {
                400 => Kind::InvalidRequest,
                403 => Kind::Forbidden,
                409 => Kind::InFlight,
                503 => Kind::Unavailable,
                _ => Kind::Internal,
            },
        };
        let detail = match kind {
            // Never echo what the server said about an unexpected failure.
            Kind::Internal | Kind::Unavailable => kind.title().to_string(),
            _ => e
                .detail()
                .map(str::to_string)
                .or_else(|| e.db_error().map(|d| d.message().to_string()))
                .unwrap_or_else(|| e.to_string()),
        };
        let mut p = Problem::new(kind, detail);
        if let Some(code) = e.code() {
            p = p.with("sqlstate", code);
        }
        if let (Some(hint), false) = (e.hint(), kind == Kind::Internal) {
            p = p.with("hint", hint);
        }
        if let Error::IdempotencyConflict { job_id, fields, .. } = &e {
            let fields: Vec<Value> = fields.iter().map(|f| Value::from(f.as_str())).collect();
            p = p.job(*job_id).with("differs", fields);
            p.location = None; // the job is not this request's
        }
        if kind == Kind::Unavailable {
            p = p.retry_after(UNAVAILABLE_RETRY_AFTER);
        }
        p
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.kind.status();
        let mut body = Map::new();
        body.insert(
            "type".into(),
            json!(format!("/problems/{}", self.kind.slug())),
        );
        body.insert("title".into(), json!(self.kind.title()));
        body.insert("status".into(), json!(status.as_u16()));
        body.insert("detail".into(), json!(self.detail));
        body.extend(self.extra);
        let mut res = (status, Json(Value::Object(body))).into_response();
        let h = res.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after {
            h.insert(RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(loc) = self.location.and_then(|l| HeaderValue::try_from(l).ok()) {
            h.insert(LOCATION, loc);
        }
        if self.kind == Kind::Unauthorized {
            h.insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"pg_intent\""),
            );
        }
        res
    }
}

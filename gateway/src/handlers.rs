//! The HTTP handlers: `POST /jobs` and `POST /providers/{provider}/jobs` (the
//! `Idempotency-Key` onto `intent.submit_job`), `GET /jobs/{job_id}` and `GET /problems/{slug}`,
//! with what they share: the caller's owner from its bearer token, the body read within its
//! limits, the database reached within its timeouts, the answers as problem+json.

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Path, Request, State};
use axum::http::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use deadpool_postgres::{Object, PoolError, TimeoutType, Timeouts};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use pg_intent_client::pg_intent_protocol::sqlstate;
use pg_intent_client::{self as intent, JobState, NewJob, Submitted};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::key::{self, KeyError};
use crate::problem::{Kind, Problem};
use crate::{Gateway, job_location, log};

/// The response header that marks a replay: the stored outcome of an earlier request with the
/// same key, not a new execution (the name Stripe's API made common).
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How long the gateway keeps a key once its job has finished, in seconds: the database's
/// `intent.retention` (7 days by default). Absent when keys are kept for ever (`never`) or the
/// gateway could not read it. The Idempotency-Key draft asks a server to publish its key
/// expiry policy; this is that policy, machine-readable (the gateway's own header).
pub static IDEMPOTENCY_KEY_RETENTION: HeaderName =
    HeaderName::from_static("idempotency-key-retention");

/// On a `201` only: this key had a job before, which finished and was purged past the
/// retention, so this request created a new job (the work runs again). `true` when so.
pub static IDEMPOTENCY_KEY_EXPIRED: HeaderName = HeaderName::from_static("idempotency-key-expired");

/// How long a read of the retention is used before it is read again.
const RETENTION_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl Gateway {
    /// The owner named by the request's bearer token: from the headers alone, before any of
    /// the body is read.
    fn owner(&self, headers: &HeaderMap) -> Result<String, Problem> {
        let unauthorized = |why: &str| Problem::new(Kind::Unauthorized, why);
        let value = single(headers, &AUTHORIZATION)?
            .ok_or_else(|| unauthorized("The request has no Authorization header."))?
            .to_str()
            .map_err(|_| unauthorized("The Authorization header is not ASCII."))?;
        let (scheme, token) = value
            .split_once(' ')
            .ok_or_else(|| unauthorized("Authorization must be `Bearer <token>`."))?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(unauthorized("Authorization must be `Bearer <token>`."));
        }
        self.config()
            .tokens
            .get(token.trim())
            .cloned()
            .ok_or_else(|| unauthorized("The bearer token is not known."))
    }

    /// The answer to a problem: a `503` carries the configured `Retry-After`.
    fn answer(&self, mut p: Problem) -> Response {
        if p.kind == Kind::Unavailable {
            p.retry_after = Some(self.config().unavailable_retry_after);
        }
        p.into_response()
    }

    /// `POST`: one job per (owner, Idempotency-Key). `provider` is `None` for the default one.
    async fn submit(&self, provider: Option<String>, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        // Whether the client may still be sending a body nobody will read.
        let unread = !body.is_end_stream();
        let (mut res, body_read) = match self.try_submit(&parts.headers, provider, body).await {
            Ok(res) => (res, true),
            Err((p, body_read)) => (self.answer(p), body_read),
        };
        if unread && !body_read {
            // Answered without the body: hyper closes the connection rather than read the
            // rest; say so.
            res.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        res
    }

    /// The answer, or the problem and whether the body was read whole.
    async fn try_submit(
        &self,
        headers: &HeaderMap,
        provider: Option<String>,
        body: Body,
    ) -> Result<Response, (Problem, bool)> {
        let unread = |p: Problem| (p, false);
        // Everything the head decides, before any of the body is read.
        let owner = self.owner(headers).map_err(unread)?;
        let provider = match provider {
            None => self.config().default_provider.clone(),
            Some(p) if self.config().providers.contains(&p) => p,
            Some(p) => {
                return Err(unread(Problem::new(
                    Kind::NotFound,
                    format!("There is no provider {p:?}."),
                )));
            }
        };
        let key = key::idempotency_key(headers)
            .map_err(|e| match e {
                KeyError::Missing => Problem::new(
                    Kind::KeyMissing,
                    "This operation is idempotent and requires an Idempotency-Key header.",
                ),
                KeyError::Malformed(why) => Problem::new(Kind::KeyMalformed, why),
            })
            .map_err(unread)?;
        if !is_json(single(headers, &CONTENT_TYPE).map_err(unread)?) {
            return Err(unread(Problem::new(
                Kind::UnsupportedMediaType,
                "The body must be sent as Content-Type: application/json.",
            )));
        }
        let body = self.read_body(headers, body).await?;
        let read = |p: Problem| (p, true);
        let params: Value = serde_json::from_slice(&body)
            .map_err(|e| Problem::new(Kind::InvalidRequest, format!("The body is not JSON: {e}.")))
            .map_err(read)?;

        let conn = self.connection().await.map_err(read)?;
        let (job, error, retention) = self
            .bounded(conn, async |conn| {
                let tx = self.begin(conn, &owner).await?;
                let job: Submitted<Value> = intent::submit_job(
                    &tx,
                    &NewJob::new(&owner, &key, &provider, &params)
                        .max_attempts(self.config().max_attempts),
                )
                .await?;
                // A failed job's error is not part of submit_job's answer: read it with the
                // row.
                let error = if job.state == JobState::Failed {
                    intent::get_job(&tx, job.job_id)
                        .await?
                        .and_then(|j| j.error)
                } else {
                    None
                };
                tx.commit().await.map_err(db_problem)?;
                // After the commit, on its own: a failed read must not undo the submit.
                let retention = self.retention(conn).await;
                Ok((job, error, retention))
            })
            .await
            .map_err(read)?;

        if job.created {
            self.inner.wake.notify_one();
            let mut res = (
                StatusCode::CREATED,
                axum::Json(representation(job.job_id, job.state, None, None)),
            )
                .into_response();
            set_location(&mut res, job.job_id);
            set_retention(&mut res, retention);
            // A created job's first version is above 1 only when an earlier job of its key was
            // purged (intent.retired_keys): say that this is a new execution, not a replay.
            if job.version > 1 {
                res.headers_mut()
                    .insert(&IDEMPOTENCY_KEY_EXPIRED, HeaderValue::from_static("true"));
            }
            return Ok(res);
        }
        match job.state {
            JobState::Succeeded | JobState::Failed | JobState::Cancelled => {
                let mut res = (
                    StatusCode::OK,
                    axum::Json(representation(job.job_id, job.state, job.result, error)),
                )
                    .into_response();
                set_location(&mut res, job.job_id);
                set_retention(&mut res, retention);
                res.headers_mut()
                    .insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                Ok(res)
            }
            JobState::Pending | JobState::Running => Err(read(Problem::new(
                Kind::InFlight,
                format!(
                    "Job {} of this Idempotency-Key is {}: the first request is still being processed.",
                    job.job_id, job.state
                ),
            )
            .job(job.job_id)
            .with("state", job.state.as_str())
            .retry_after(self.config().in_flight_retry_after))),
            JobState::Unknown => Err(read(Problem::new(
                Kind::OutcomeUnknown,
                format!(
                    "Job {}: the provider did not answer in time and may still have done the work; it is being reconciled.",
                    job.job_id
                ),
            )
            .job(job.job_id)
            .with("state", job.state.as_str())
            .retry_after(self.config().unknown_retry_after))),
        }
    }

    /// The body, at most [`HttpConfig::max_body_bytes`] of it, within
    /// [`HttpConfig::body_timeout`]. A problem is never answered after the whole body.
    async fn read_body(&self, headers: &HeaderMap, body: Body) -> Result<Bytes, (Problem, bool)> {
        let http = &self.config().http;
        let too_large = || {
            Problem::new(
                Kind::PayloadTooLarge,
                format!(
                    "The body is larger than the {} bytes this gateway reads.",
                    http.max_body_bytes
                ),
            )
        };
        let length = single(headers, &CONTENT_LENGTH)
            .map_err(|p| (p, false))?
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if length.is_some_and(|n| n > http.max_body_bytes as u64) {
            return Err((too_large(), false));
        }
        let limited = Limited::new(body, http.max_body_bytes);
        match tokio::time::timeout(http.body_timeout, limited.collect()).await {
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
            Ok(Err(e)) if e.is::<LengthLimitError>() => Err((too_large(), false)),
            // The client went away or sent a broken body: nobody reads this answer.
            Ok(Err(e)) => Err((
                Problem::new(
                    Kind::InvalidRequest,
                    format!("The body could not be read: {e}."),
                ),
                false,
            )),
            Err(_) => Err((
                Problem::new(
                    Kind::RequestTimeout,
                    format!(
                        "The body did not arrive within {:?}; nothing was written.",
                        http.body_timeout
                    ),
                ),
                false,
            )),
        }
    }

    /// `GET /jobs/{job_id}`: the job, if it is the caller's.
    async fn try_show(&self, headers: &HeaderMap, job_id: &str) -> Result<Response, Problem> {
        let owner = self.owner(headers)?;
        let not_found = || Problem::new(Kind::NotFound, format!("There is no job {job_id}."));
        let job_id = Uuid::parse_str(job_id).map_err(|_| not_found())?;
        let conn = self.connection().await?;
        let job = self
            .bounded(conn, async |conn| {
                let tx = self.begin(conn, &owner).await?;
                let job = intent::get_job(&tx, job_id).await?;
                tx.commit().await.map_err(db_problem)?;
                Ok(job)
            })
            .await?;
        // Bound, the database shows no other owner's job; unbound, this check is the only one.
        let job = job.filter(|j| j.owner_id == owner).ok_or_else(not_found)?;
        Ok(axum::Json(representation(job.id, job.state, job.result, job.error)).into_response())
    }

    /// A connection of the pool for a request, within the wait, connect and recycle timeouts.
    async fn connection(&self) -> Result<Object, Problem> {
        let db = &self.config().database;
        let timeouts = Timeouts {
            wait: Some(db.wait_timeout),
            create: Some(db.connect_timeout),
            recycle: Some(db.recycle_timeout),
        };
        let got = match self.inner.pool.timeout_get(&timeouts).await {
            // A pool built without a runtime cannot time out by itself.
            Err(PoolError::NoRuntimeSpecified) => {
                let bound = db.wait_timeout + db.connect_timeout + db.recycle_timeout;
                tokio::time::timeout(bound, self.inner.pool.get())
                    .await
                    .unwrap_or(Err(PoolError::Timeout(TimeoutType::Wait)))
            }
            got => got,
        };
        got.map_err(|e| {
            log(&format!("no database connection: {e}"));
            let detail = match e {
                PoolError::Timeout(TimeoutType::Wait) => format!(
                    "No database connection was free within {:?}.",
                    db.wait_timeout
                ),
                PoolError::Timeout(TimeoutType::Create) => format!(
                    "The database did not accept a connection within {:?}.",
                    db.connect_timeout
                ),
                PoolError::Timeout(TimeoutType::Recycle) => format!(
                    "A database connection could not be checked within {:?}.",
                    db.recycle_timeout
                ),
                _ => "The database cannot be reached.".to_string(),
            };
            Problem::new(Kind::Unavailable, detail)
        })
    }

    /// Runs a request's transaction on `conn` within [`DatabaseConfig::transaction_timeout`].
    /// Past it the connection is taken out of the pool and closed: it may be stuck in the
    /// middle of a statement, and must not serve another request. So is a connection whose
    /// transaction ended in a `503`.
    /// The database's retention (`None`: `never`, or not readable), read at most once a
    /// [`RETENTION_FRESH_FOR`] on a request's connection, outside its transaction.
    async fn retention(&self, conn: &Object) -> Option<std::time::Duration> {
        let now = tokio::time::Instant::now();
        if let Some((at, r)) = *self
            .inner
            .retention
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            && now.duration_since(at) < RETENTION_FRESH_FOR
        {
            return r;
        }
        let r = match intent::retention(conn).await {
            Ok(r) => r,
            Err(e) => {
                log(&format!("cannot read intent.retention: {e}"));
                None
            }
        };
        *self
            .inner
            .retention
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((now, r));
        r
    }

    async fn bounded<T>(
        &self,
        mut conn: Object,
        work: impl AsyncFnOnce(&mut Object) -> Result<T, Problem>,
    ) -> Result<T, Problem> {
        let limit = self.config().database.transaction_timeout;
        match tokio::time::timeout(limit, work(&mut conn)).await {
            Ok(Err(p)) if p.kind == Kind::Unavailable => {
                // The connection may be the broken one (its backend terminated, the server
                // restarting): the retry must not get it back from the pool before its
                // closing is noticed. A new one costs a connect.
                drop(Object::take(conn));
                Err(p)
            }
            Ok(done) => done,
            Err(_) => {
                drop(Object::take(conn));
                log(&format!(
                    "the database did not answer within {limit:?}: connection closed"
                ));
                Err(Problem::new(
                    Kind::Unavailable,
                    format!("The database did not answer within {limit:?}."),
                ))
            }
        }
    }

    /// Begins a request's transaction: its statement timeout, and its owner binding.
    async fn begin<'c>(
        &self,
        conn: &'c mut Object,
        owner: &str,
    ) -> Result<deadpool_postgres::Transaction<'c>, Problem> {
        let tx = conn.transaction().await.map_err(db_problem)?;
        let timeout = self.config().database.statement_timeout;
        if !timeout.is_zero() {
            // SET LOCAL: it ends with the transaction, and the pooled connection (which the
            // worker may use next) keeps the server's setting.
            tx.batch_execute(&format!(
                "SET LOCAL statement_timeout = {}",
                timeout.as_millis().max(1)
            ))
            .await
            .map_err(db_problem)?;
        }
        if self.config().bind_owner {
            intent::bind_owner(&tx, owner).await?;
        }
        Ok(tx)
    }
}

/// The one value of a header that must appear at most once: two `Authorization` headers
/// leave the caller ambiguous, so the request is refused rather than the first one believed.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, Problem> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    let more = values.count();
    if more > 0 {
        return Err(Problem::new(
            Kind::HeaderRepeated,
            format!(
                "The request has {} {name} headers; send exactly one.",
                more + 1
            ),
        ));
    }
    Ok(first)
}

/// The JSON of a job.
fn representation(
    job_id: Uuid,
    state: JobState,
    result: Option<Value>,
    error: Option<Value>,
) -> Value {
    let mut v = json!({"job_id": job_id, "state": state.as_str()});
    if let Some(r) = result {
        v["result"] = r;
    }
    if let Some(e) = error {
        v["error"] = e;
    }
    v
}

/// `Idempotency-Key-Retention: <seconds>`, when the retention is known and not `never`.
fn set_retention(res: &mut Response, retention: Option<std::time::Duration>) {
    if let Some(r) = retention {
        res.headers_mut()
            .insert(&IDEMPOTENCY_KEY_RETENTION, HeaderValue::from(r.as_secs()));
    }
}

fn set_location(res: &mut Response, job_id: Uuid) {
    if let Ok(v) = HeaderValue::try_from(job_location(job_id)) {
        res.headers_mut().insert(LOCATION, v);
    }
}

/// `application/json` or any `+json` media type.
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(ct) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A tokio-postgres error outside the client's calls (BEGIN, SET LOCAL, COMMIT): `503` for a
/// transient SQLSTATE or when the server said nothing (the connection broke), `500` else.
fn db_problem(e: tokio_postgres::Error) -> Problem {
    let kind = match e.code() {
        Some(code) if sqlstate::http_status(code.code()) != 503 => Kind::Internal,
        _ => Kind::Unavailable,
    };
    let p = Problem::new(kind, kind.title());
    match e.code() {
        Some(code) => p.with("sqlstate", code.code()),
        None => p,
    }
}

pub(crate) async fn create(State(gw): State<Gateway>, req: Request) -> Response {
    gw.submit(None, req).await
}

pub(crate) async fn create_on(
    State(gw): State<Gateway>,
    Path(provider): Path<String>,
    req: Request,
) -> Response {
    gw.submit(Some(provider), req).await
}

pub(crate) async fn show(
    State(gw): State<Gateway>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    match gw.try_show(&headers, &job_id).await {
        Ok(res) => res,
        Err(p) => gw.answer(p),
    }
}

pub(crate) async fn explain(Path(slug): Path<String>) -> Response {
    match Kind::from_slug(&slug) {
        Some(kind) => (
            [(CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!(
                "{} ({})\n\n{}\n",
                kind.title(),
                kind.status(),
                kind.explanation()
            ),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        let mut h = HeaderMap::new();
        assert!(!is_json(h.get(CONTENT_TYPE)));
        for (ct, ok) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("application/merge-patch+json", true),
            ("text/plain", false),
            ("application/jsonx", false),
        ] {
            h.insert(CONTENT_TYPE, ct.parse().unwrap());
            assert_eq!(is_json(h.get(CONTENT_TYPE)), ok, "{ct}");
        }
    }

    #[test]
    fn every_problem_has_a_page() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_slug(kind.slug()), Some(kind));
            assert!(!kind.explanation().is_empty());
        }
    }
}

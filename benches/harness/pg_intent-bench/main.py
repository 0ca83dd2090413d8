#!/usr/bin/env python3
"""Long-horizon adapter for pg_intent, a PostgreSQL extension.

pg_intent is not a job-queue library: it is an extension whose SQL API keeps one durable job
per (owner, idempotency key) and runs it as attempts. Its worker surface is plain SQL, so this
adapter is the worker loop a Python user would write around it:

- producer: `intent.submit_jobs(...)` — one call per batch, one job per key. A batch whose
  connection dies mid-call is sent again with the same keys: a replay answers created = false
  and writes nothing, so no job is counted (or inserted) twice.
- workers: WORKER_COUNT connections, each looping `intent.claim_attempts(providers, worker,
  lease, max_jobs)` (SKIP LOCKED, longest-waiting first, from where the backend's last claim
  stopped: intent.claim_rescan), a synthetic JOB_WORK_MS per job, then `intent.complete_attempt`
  for each claimed attempt in one statement. A completion whose connection dies is sent again
  after reconnecting: asking again answers `won` and changes nothing.
- reconciler: pg_intent never re-runs an attempt whose outcome is unknown (a worker that died
  after its claim committed, whose lease then ran out); it lists it in
  `intent.attempts_to_reconcile` until someone decides. The bench job is a no-op, so the
  reconciler decides "did not happen" with `intent.abandon_attempt`, which makes the job
  claimable again: what an application whose task is safe to repeat would do.

Metrics follow CONTRIBUTING_ADAPTERS.md: claim_* is pickup latency (the producer's
enqueued_at_ms in the job's params → the worker holding the claimed row), in a 30 s window.
queue_depth is counted by the adapter (jobs created + jobs returned to pending by the
reconciler − attempts claimed), not read from the database: a count over intent.jobs would
read the same dead index entries a held snapshot leaves, and put the observer's own cost into
the figures being measured.
"""
from __future__ import annotations

import asyncio
import collections
import datetime as _dt
import json
import math
import os
import signal
import sys
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

SYSTEM = "pg_intent"
PROVIDER = "bench"
OWNER = "bench"
WINDOW_S = 30

CONNECTION_LOST = (
    psycopg.OperationalError,
    psycopg.errors.AdminShutdown,
    psycopg.errors.ConnectionDoesNotExist,
    psycopg.errors.CannotConnectNow,
)


# PG_INTENT_CLAIM_RESCAN (e.g. "10s"): the session's intent.claim_rescan, for experiments; unset,
# the server's (1 s by default).
CONNECT_OPTIONS = (
    {"options": f"-c intent.claim_rescan={os.environ['PG_INTENT_CLAIM_RESCAN']}"}
    if os.environ.get("PG_INTENT_CLAIM_RESCAN") else {}
)


def env_int(key: str, default: int) -> int:
    value = os.environ.get(key)
    return int(value) if value not in (None, "") else default


def env_str(key: str, default: str) -> str:
    value = os.environ.get(key)
    return value if value not in (None, "") else default


def database_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("DATABASE_URL must be set")
    return url


def instance_id() -> int:
    try:
        return int(os.environ.get("BENCH_INSTANCE_ID", "0"))
    except ValueError:
        return 0


def observer_enabled() -> bool:
    return instance_id() == 0


OBSERVER_METRICS = frozenset(
    {"queue_depth", "running_depth", "retryable_depth", "scheduled_depth", "total_backlog",
     "producer_target_rate"}
)


def read_producer_rate(default: float) -> float:
    path = os.environ.get("PRODUCER_RATE_CONTROL_FILE")
    if not path:
        return default
    try:
        with open(path) as fh:
            return float(fh.read().strip())
    except Exception:
        return default


def emit(record: dict) -> None:
    record.setdefault("instance_id", instance_id())
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    print(f"[pg_intent] {msg}", file=sys.stderr, flush=True)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Window:
    """Latencies of the last WINDOW_S seconds, bounded (a deque with maxlen) as the Python
    adapters upstream keep them."""

    def __init__(self, maxlen: int = 65536) -> None:
        self.items: collections.deque[tuple[float, float]] = collections.deque(maxlen=maxlen)

    def push(self, t: float, v: float) -> None:
        self.items.append((t, v))

    def percentiles(self, now: float) -> tuple[float, float, float]:
        cutoff = now - WINDOW_S
        values = sorted(v for t, v in self.items if t >= cutoff)
        if not values:
            return 0.0, 0.0, 0.0
        n = len(values)

        def q(p: float) -> float:
            return float(values[min(n - 1, max(0, int(round(p * (n - 1)))))])

        return q(0.50), q(0.95), q(0.99)


LOST = {"connections": 0}


class Conn:
    """One connection that reconnects after chaos (pg_terminate_backend, a restart)."""

    def __init__(self, name: str, shutdown: asyncio.Event) -> None:
        self.name = name
        self.shutdown = shutdown
        self.conn: psycopg.AsyncConnection | None = None

    async def get(self) -> psycopg.AsyncConnection:
        delay = 0.1
        while self.conn is None or self.conn.closed:
            if self.shutdown.is_set():
                raise asyncio.CancelledError()
            try:
                self.conn = await psycopg.AsyncConnection.connect(
                    database_url(), autocommit=True, application_name=f"pg_intent-bench {self.name}",
                    **CONNECT_OPTIONS,
                )
            except psycopg.Error:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        return self.conn

    async def lost(self) -> None:
        LOST["connections"] += 1
        if self.conn is not None:
            try:
                await self.conn.close()
            except Exception:
                pass
        self.conn = None

    async def fetch(self, sql: str, params=None) -> list[tuple]:
        """Runs a statement; on a lost connection, reconnects and raises ConnectionError so that
        the caller decides whether to send it again."""
        conn = await self.get()
        try:
            async with conn.cursor() as cur:
                await cur.execute(sql, params, prepare=True)
                return await cur.fetchall()
        except CONNECTION_LOST as exc:
            await self.lost()
            raise ConnectionError(str(exc)) from exc


async def scenario_long_horizon() -> None:
    sample_every_s = env_int("SAMPLE_EVERY_S", 5)
    producer_rate = float(env_int("PRODUCER_RATE", 800))
    producer_mode = env_str("PRODUCER_MODE", "fixed")
    pacing_mode = env_str("PRODUCER_PACING", "adapter")
    target_depth = env_int("TARGET_DEPTH", 1000)
    worker_count = env_int("WORKER_COUNT", 32)
    payload_bytes = env_int("JOB_PAYLOAD_BYTES", 256)
    work_ms = env_int("JOB_WORK_MS", 1)
    batch_ms = env_int("PRODUCER_BATCH_MS", 25)
    batch_max = env_int("PRODUCER_BATCH_MAX", 128)
    poll_ms = env_int("POLL_INTERVAL_MS", 50)
    # The lease is the attempt's timeout; LEASE_DEADLINE_MS is the harness's generic knob.
    lease_ms = env_int("LEASE_DEADLINE_MS", 10_000)
    max_attempts = env_int("JOB_MAX_ATTEMPTS", 25)
    reconcile_every_s = env_int("RECONCILE_EVERY_S", 2)
    # Jobs per claim: the same sizing the pg-boss adapter uses for its batchSize.
    claim_batch = env_int(
        "CLAIM_BATCH",
        max(1, min(64, math.ceil(producer_rate * 1.25 / max(worker_count * 2, 1)))),
    )
    run_tag = f"{uuid.uuid4().hex[:8]}-{instance_id()}"
    db_name = database_url().rsplit("/", 1)[-1].split("?", 1)[0]

    shutdown = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown.set)

    setup = Conn("setup", shutdown)
    (extversion,), = await setup.fetch("SELECT extversion FROM pg_extension WHERE extname = 'pg_intent'")
    # The setting exists once the library is loaded in this backend: call into it first.
    await setup.fetch("SELECT intent.job_id('bench', 'load')")
    (rescan,), = await setup.fetch("SELECT current_setting('intent.claim_rescan', true)")
    (pgver,), = await setup.fetch("SHOW server_version")
    await setup.lost()

    emit({
        "kind": "descriptor",
        "system": SYSTEM,
        "event_tables": ["intent.jobs", "intent.attempts", "intent.events"],
        "event_indexes": ["intent.jobs_claimable", "intent.jobs_pkey", "intent.attempts_pkey"],
        "extensions": ["pg_intent"],
        "version": f"pg_intent {extversion}",
        "schema_version": extversion,
        "db_name": db_name,
        "started_at": now_iso(),
        "settings": {"claim_batch": claim_batch, "poll_interval_ms": poll_ms, "lease_ms": lease_ms,
                     "max_attempts": max_attempts, "intent.claim_rescan": rescan,
                     "server_version": pgver},
    })
    log(f"extension {extversion}, claim_rescan {rescan}, {worker_count} workers, claim batch "
        f"{claim_batch}, poll {poll_ms} ms, lease {lease_ms} ms, pacing {pacing_mode}")

    producer_lat = Window()
    claim_lat = Window()
    e2e_lat = Window()
    counts = {"enqueued": 0, "completed": 0, "claimed": 0, "requeued": 0, "replayed": 0,
              "refused": 0, "lost": 0}
    target_rate = {"value": producer_rate}
    padding = "x" * max(0, payload_bytes - 96)

    # ── producer ────────────────────────────────────────────────────────
    tokens: asyncio.Queue[int] | None = None
    if pacing_mode == "harness" and producer_mode == "fixed":
        tokens = asyncio.Queue()

        async def stdin_reader() -> None:
            reader = asyncio.StreamReader()
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
            while not shutdown.is_set():
                raw = await reader.readline()
                if not raw:
                    return
                line = raw.decode(errors="replace").strip()
                if line.startswith("ENQUEUE "):
                    try:
                        n = int(line.split(" ", 1)[1])
                    except ValueError:
                        continue
                    if n > 0:
                        tokens.put_nowait(n)

    producer_conn = Conn("producer", shutdown)
    seq = 0

    async def submit(n: int) -> None:
        nonlocal seq
        keys, params = [], []
        for _ in range(n):
            seq += 1
            keys.append(f"{run_tag}-{seq}")
            params.append(Jsonb({"seq": seq, "enqueued_at_ms": time.time() * 1000.0,
                                 "payload_padding": padding}))
        sql = ("SELECT count(*) FILTER (WHERE created), count(*) FILTER (WHERE NOT created), "
               "count(*) FILTER (WHERE sqlstate IS NOT NULL) "
               "FROM intent.submit_jobs(%s::text[], %s::text[], %s::text[], %s::jsonb[], NULL, %s::int[])")
        args = ([OWNER] * n, keys, [PROVIDER] * n, params, [max_attempts] * n)
        started = time.monotonic()
        while True:
            try:
                (created, replayed, refused), = await producer_conn.fetch(sql, args)
                break
            except ConnectionError:
                if shutdown.is_set():
                    return
                # Same keys again: a batch that did commit is answered created = false.
                continue
            except psycopg.Error as exc:
                log(f"submit_jobs: {exc!r}")
                await asyncio.sleep(0.1)
                continue
        per_job = (time.monotonic() - started) * 1000.0 / n
        t = loop.time()
        for _ in range(n):
            producer_lat.push(t, per_job)
        counts["enqueued"] += created
        counts["replayed"] += replayed
        counts["refused"] += refused
        if refused:
            log(f"submit_jobs refused {refused} intents")

    async def producer() -> None:
        credit = 0.0
        last = loop.time()
        while not shutdown.is_set():
            if producer_mode == "depth-target":
                target_rate["value"] = 0.0
                depth = counts["enqueued"] + counts["requeued"] - counts["claimed"]
                n = min(batch_max, target_depth - depth)
                if n <= 0:
                    await asyncio.sleep(batch_ms / 1000.0)
                    continue
                await submit(n)
            elif tokens is not None:
                target_rate["value"] = read_producer_rate(producer_rate)
                try:
                    n = await asyncio.wait_for(tokens.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    continue
                await submit(min(n, batch_max))
            else:
                # Credit on real elapsed time (CONTRIBUTING_ADAPTERS.md, producer pacing).
                rate = read_producer_rate(producer_rate)
                target_rate["value"] = rate
                sleep_for = batch_ms / 1000.0 - (loop.time() - last)
                if sleep_for > 0:
                    await asyncio.sleep(sleep_for)
                now = loop.time()
                credit += max(rate, 0.0) * (now - last)
                last = now
                while credit >= 1.0 and not shutdown.is_set():
                    n = min(batch_max, int(credit))
                    credit -= n
                    await submit(n)

    # ── workers ─────────────────────────────────────────────────────────
    claim_sql = ("SELECT attempt_id, version, (params->>'enqueued_at_ms')::float8 "
                 "FROM intent.claim_attempts(%s::text[], %s, %s::interval, %s)")
    complete_sql = ("SELECT intent.complete_attempt(a, v, %s::jsonb)::text "
                    "FROM unnest(%s::uuid[], %s::bigint[]) AS t(a, v)")
    result = Jsonb({"ok": True})

    async def worker(idx: int) -> None:
        conn = Conn(f"worker-{idx}", shutdown)
        name = f"{run_tag}-w{idx}"
        lease = f"{lease_ms} milliseconds"
        while not shutdown.is_set():
            try:
                rows = await conn.fetch(claim_sql, ([PROVIDER], name, lease, claim_batch))
            except ConnectionError:
                # If the claim committed before the connection died, its attempts run out their
                # lease and the reconciler returns their jobs to the queue.
                continue
            except psycopg.Error as exc:
                log(f"worker {idx}: claim: {exc!r}")
                await asyncio.sleep(0.1)
                continue
            if not rows:
                await asyncio.sleep(poll_ms / 1000.0)
                continue
            counts["claimed"] += len(rows)
            now_ms = time.time() * 1000.0
            t = loop.time()
            for _, _, enq in rows:
                if enq is not None:
                    claim_lat.push(t, now_ms - enq)
            if work_ms > 0:
                await asyncio.sleep(work_ms * len(rows) / 1000.0)
            ids = [r[0] for r in rows]
            versions = [r[1] for r in rows]
            while True:
                try:
                    answers = await conn.fetch(complete_sql, (result, ids, versions))
                    break
                except ConnectionError:
                    if shutdown.is_set():
                        return
                    # Asking again is safe: a completion that committed answers `won` again.
                    continue
                except psycopg.Error as exc:
                    log(f"worker {idx}: complete: {exc!r}")
                    await asyncio.sleep(0.1)
                    continue
            won = sum(1 for (a,) in answers if a == "won")
            counts["completed"] += won
            counts["lost"] += len(answers) - won
            done_ms = time.time() * 1000.0
            t = loop.time()
            for _, _, enq in rows:
                if enq is not None:
                    e2e_lat.push(t, done_ms - enq)

    # ── reconciler ──────────────────────────────────────────────────────
    async def reconciler() -> None:
        conn = Conn("reconciler", shutdown)
        # Every replica's and every earlier process's attempts (a killed adapter's too):
        # abandoning an attempt twice does nothing the second time.
        sql = ("SELECT count(intent.abandon_attempt(attempt_id, 'bench: the job is a no-op, safe to run again')) "
               "FROM intent.attempts_to_reconcile WHERE owner_id = %s")
        while not shutdown.is_set():
            await asyncio.sleep(reconcile_every_s)
            try:
                (n,), = await conn.fetch(sql, (OWNER,))
            except ConnectionError:
                continue
            except psycopg.Error as exc:
                log(f"reconciler: {exc}")
                continue
            if n:
                counts["requeued"] += n
                log(f"reconciler: abandoned {n} attempts whose lease ran out (their jobs are claimable again)")

    # ── sampler ─────────────────────────────────────────────────────────
    async def sampler() -> None:
        await asyncio.sleep(sample_every_s - (time.time() % sample_every_s))
        last_enq, last_done = counts["enqueued"], counts["completed"]
        while not shutdown.is_set():
            now = loop.time()
            p = producer_lat.percentiles(now)
            c = claim_lat.percentiles(now)
            e = e2e_lat.percentiles(now)
            enq_rate = (counts["enqueued"] - last_enq) / sample_every_s
            done_rate = (counts["completed"] - last_done) / sample_every_s
            last_enq, last_done = counts["enqueued"], counts["completed"]
            depth = max(0, counts["enqueued"] + counts["requeued"] - counts["claimed"])
            ts = now_iso()
            for metric, value, window in (
                ("producer_p50_ms", p[0], WINDOW_S), ("producer_p95_ms", p[1], WINDOW_S),
                ("producer_p99_ms", p[2], WINDOW_S),
                ("subscriber_p50_ms", c[0], WINDOW_S), ("subscriber_p95_ms", c[1], WINDOW_S),
                ("subscriber_p99_ms", c[2], WINDOW_S),
                ("claim_p50_ms", c[0], WINDOW_S), ("claim_p95_ms", c[1], WINDOW_S),
                ("claim_p99_ms", c[2], WINDOW_S),
                ("end_to_end_p50_ms", e[0], WINDOW_S), ("end_to_end_p95_ms", e[1], WINDOW_S),
                ("end_to_end_p99_ms", e[2], WINDOW_S),
                ("enqueue_rate", enq_rate, sample_every_s),
                ("completion_rate", done_rate, sample_every_s),
                ("queue_depth", depth, 0),
                ("producer_target_rate", target_rate["value"], 0),
            ):
                if metric in OBSERVER_METRICS and not observer_enabled():
                    continue
                emit({"t": ts, "system": SYSTEM, "kind": "adapter", "subject_kind": "adapter",
                      "subject": "", "metric": metric, "value": value, "window_s": window})
            await asyncio.sleep(sample_every_s - (time.time() % sample_every_s))

    tasks = [asyncio.create_task(producer()), asyncio.create_task(sampler()),
             asyncio.create_task(reconciler())]
    if tokens is not None:
        tasks.append(asyncio.create_task(stdin_reader()))
    tasks.extend(asyncio.create_task(worker(i)) for i in range(worker_count))

    await shutdown.wait()
    for task in tasks:
        task.cancel()
    try:
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=4)
    except asyncio.TimeoutError:  # exit within the contract's 5 s whatever a task waits on
        results = []
        log("some tasks did not stop within 4 s")
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
            log(f"task ended with {r!r}")
    counts["connections_lost"] = LOST["connections"] - 1  # less the setup connection's close
    log("counts at exit: " + json.dumps(counts))


async def main() -> None:
    scenario = env_str("SCENARIO", "long_horizon")
    if scenario != "long_horizon":
        raise RuntimeError(f"Unsupported scenario {scenario!r} for pg_intent-bench")
    await scenario_long_horizon()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass

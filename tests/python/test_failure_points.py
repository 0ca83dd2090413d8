"""The four failure points of pg_intent, from Python over psycopg 3, through the SQL API alone.

The same claims as tests/tests/{double_click,same_key_different_input,timeout,
reverse_order_finish}.rs, made by a client that knows nothing of Rust: it derives job ids
itself, matches SQLSTATEs by code (e.sqlstate), and reads the DETAIL, its facts line and the
HINT (e.diag) as docs/reference.md § 6 describes them. Every protocol call is made by an
ordinary role in intent_app; an intent_operator role abandons attempts and reads the tables.
Concurrent claims use real concurrent connections, one thread each, released by a barrier.
"""

import hashlib
import threading
import time
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

# Every run names its own owners, so the suite can run again against the same database.
RUN = uuid.uuid4().hex[:8]


def owner(name):
    return f"{name}-{RUN}"


# --- the SQL API -------------------------------------------------------------------------------


def job_id_of(owner_id, key):
    """The job id docs/reference.md § 1.4 derives: SHA-256(owner ‖ 0x00 ‖ key), first 16 bytes, UUID version 8,
    RFC 9562 variant, last two bytes zero (README § "The SQL API at a glance")."""
    b = bytearray(hashlib.sha256(owner_id.encode() + b"\0" + key.encode()).digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x80
    b[8] = (b[8] & 0x3F) | 0x80
    b[14] = b[15] = 0
    return uuid.UUID(bytes=bytes(b))


def attempt_id_of(job_id, n):
    return uuid.UUID(bytes=job_id.bytes[:14] + n.to_bytes(2, "big"))


def submit(conn, owner_id, key, provider, params, contract=None, max_attempts=3):
    row = conn.execute(
        "SELECT job_id, created, state::text, version, result"
        "  FROM intent.submit_job(%s, %s, %s, %s, %s, %s)",
        (owner_id, key, provider, Jsonb(params), contract, max_attempts),
    ).fetchone()
    return dict(zip(("job_id", "created", "state", "version", "result"), row))


def begin(conn, job_id, lease="1 minute"):
    row = conn.execute(
        "SELECT attempt_id, attempt_no, version FROM intent.begin_attempt(%s, lease => %s::interval)",
        (job_id, lease),
    ).fetchone()
    return dict(zip(("attempt_id", "attempt_no", "version"), row))


def complete(conn, attempt, result):
    return conn.execute(
        "SELECT intent.complete_attempt(%s, %s, %s)::text",
        (attempt["attempt_id"], attempt["version"], Jsonb(result)),
    ).fetchone()[0]


def fail(conn, attempt, error, retryable=True):
    return conn.execute(
        "SELECT intent.fail_attempt(%s, %s, %s, %s)::text",
        (attempt["attempt_id"], attempt["version"], Jsonb(error), retryable),
    ).fetchone()[0]


def mark_unknown(conn, attempt, reason=None):
    conn.execute("SELECT intent.mark_unknown(%s, %s)", (attempt["attempt_id"], reason))


def heartbeat(conn, attempt, extend=None):
    return conn.execute(
        "SELECT intent.heartbeat(%s, %s::interval)", (attempt["attempt_id"], extend)
    ).fetchone()[0]


def abandon(conn, attempt, reason):
    conn.execute("SELECT intent.abandon_attempt(%s, %s)", (attempt["attempt_id"], reason))


# --- refusals: SQLSTATE, DETAIL, facts line, HINT ---------------------------------------------


def split_facts(detail):
    """The DETAIL's sentence and its facts line (docs/reference.md § 6): the last line, when it
    starts with "Facts: ", holds key=value pairs separated by single spaces."""
    sentence, _, last = detail.rpartition("\n")
    if not last.startswith("Facts: "):
        return detail, None
    facts = dict(pair.split("=", 1) for pair in last[len("Facts: ") :].split(" ") if "=" in pair)
    return sentence, facts


class Refusal:
    def __init__(self, e):
        d = e.diag
        self.sqlstate = e.sqlstate
        self.severity = d.severity_nonlocalized or d.severity
        self.message = d.message_primary
        self.raw_detail = d.message_detail
        self.hint = d.message_hint
        self.source_file = d.source_file
        self.detail, self.facts = split_facts(d.message_detail) if d.message_detail else (None, None)

    def __repr__(self):
        return f"Refusal({self.sqlstate}: {self.message} | {self.raw_detail!r} | {self.hint!r})"


def refusal(call, sqlstate):
    """Runs call(), which must be refused with exactly this SQLSTATE, and returns the refusal."""
    try:
        answer = call()
    except psycopg.Error as e:
        assert e.sqlstate == sqlstate, f"expected {sqlstate}, got {e.sqlstate}: {e}"
        r = Refusal(e)
        assert r.severity == "ERROR"
        if sqlstate.startswith("IJ"):
            # The facts line is believed only from pg_intent itself (§ 6).
            assert r.source_file == "pg_intent", r
            assert r.message and r.detail and r.hint, f"{sqlstate} has a message, DETAIL and HINT: {r}"
        return r
    pytest.fail(f"expected SQLSTATE {sqlstate}, got an answer: {answer!r}")


# --- reading the tables (intent_operator) ------------------------------------------------------


def job_row(op, job_id):
    row = op.execute(
        "SELECT state::text, version, completed_by, result, error, provider, params, contract"
        "  FROM intent.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None, f"no job {job_id}"
    keys = ("state", "version", "completed_by", "result", "error", "provider", "params", "contract")
    return dict(zip(keys, row))


def job_row_raw(op, job_id):
    """The row as stored, with its physical identity: equal before and after proves that a call
    did not even rewrite it."""
    return op.execute(
        "SELECT j.ctid::text || ' xmin=' || j.xmin::text || ' ' || j::text FROM intent.jobs j WHERE id = %s",
        (job_id,),
    ).fetchone()[0]


def attempt_row(op, attempt_id):
    row = op.execute(
        "SELECT state::text, result, finished_at IS NOT NULL FROM intent.attempts WHERE id = %s",
        (attempt_id,),
    ).fetchone()
    assert row is not None, f"no attempt {attempt_id}"
    return dict(zip(("state", "result", "finished"), row))


def events(op, job_id):
    return op.execute(
        "SELECT kind, attempt_id, detail FROM intent.events WHERE job_id = %s ORDER BY id", (job_id,)
    ).fetchall()


def digest(op):
    """Row counts and a digest of every row (with its physical identity) of the three tables."""
    return op.execute(
        """SELECT (SELECT count(*) FROM intent.jobs), (SELECT count(*) FROM intent.attempts),
                  (SELECT count(*) FROM intent.events),
                  md5(coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.jobs t), '')
                   || '#' || coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.attempts t), '')
                   || '#' || coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.events t), ''))"""
    ).fetchone()


def rows_for(op, owner_id, key):
    return op.execute(
        "SELECT count(*) FROM intent.jobs WHERE owner_id = %s AND idempotency_key = %s", (owner_id, key)
    ).fetchone()[0]


def wait_past_deadline(op, attempt):
    """Waits on the server's clock, so the test does not depend on two clocks agreeing."""
    for _ in range(2400):
        if op.execute(
            "SELECT deadline < clock_timestamp() FROM intent.attempts WHERE id = %s", (attempt["attempt_id"],)
        ).fetchone()[0]:
            return
        time.sleep(0.025)
    pytest.fail(f"attempt {attempt['attempt_id']} never ran out of lease")


def wait_for_lock_waiters(watcher, application_name, n):
    """Waits until n sessions named application_name wait for a lock: proof that concurrent calls
    really are queued. The watcher is a session of the waiters' own role, which may see their
    wait events. On a Citus coordinator (the citus target) a session waits for a lock on a
    worker: it counts when citus_lock_waits, the wait graph of every node, names it."""
    on_citus = watcher.execute(
        "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"
    ).fetchone()[0]
    sql = (
        "SELECT count(*) FROM citus_stat_activity WHERE application_name = %s"
        " AND (wait_event_type = 'Lock' OR global_pid IN (SELECT waiting_gpid FROM citus_lock_waits))"
        if on_citus
        else "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
    )
    for _ in range(1000):
        waiting = watcher.execute(sql, (application_name,)).fetchone()[0]
        if waiting >= n:
            return
        time.sleep(0.02)
    pytest.fail(f"only {waiting} of {n} sessions {application_name!r} wait for a lock")


# --- real concurrency --------------------------------------------------------------------------


def at_once(conns, call):
    """Runs call(i, conn) on every connection at the same instant, one thread each, released
    together by a barrier. Returns, in connection order, each answer or the psycopg.Error it
    raised."""
    barrier = threading.Barrier(len(conns))
    answers = [None] * len(conns)
    crashed = []

    def run(i):
        barrier.wait()
        try:
            answers[i] = call(i, conns[i])
        except psycopg.Error as e:
            answers[i] = e
        except BaseException as e:  # an assertion in a thread must fail the test
            crashed.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(conns))]
    for t in threads:
        t.start()
    return threads, answers, crashed


def join(threads, answers, crashed):
    for t in threads:
        t.join(timeout=90)
        assert not t.is_alive(), "a concurrent call never returned"
    if crashed:
        raise crashed[0]
    return answers


def stampede(conns, call):
    return join(*at_once(conns, call))


# --- the ordinary role ------------------------------------------------------------------------


def test_the_calls_are_made_by_an_ordinary_intent_app_role(app, operator):
    assert app.execute("SELECT current_setting('is_superuser')").fetchone()[0] == "off"
    assert app.execute("SELECT pg_has_role('intent_app', 'MEMBER')").fetchone()[0]
    # It has exactly the application's calls: no table reads, no abandon_attempt.
    refusal(lambda: app.execute("SELECT count(*) FROM intent.jobs").fetchone(), "42501")
    refusal(lambda: app.execute("SELECT intent.abandon_attempt(%s, 'x')", (uuid.uuid4(),)), "42501")
    assert operator.execute("SELECT current_setting('is_superuser')").fetchone()[0] == "off"


# --- failure point 1: the double click ----------------------------------------------------------

PARAMS = {"prompt": "a cat in a hat", "size": [1024, 1024], "seed": 42, "nested": {"a": [1, 2, {"b": None}]}}


def test_double_click_identical_submits_at_the_same_instant_make_one_job(connect, operator):
    clients = [connect("app", "double_click") for _ in range(8)]
    for round_ in range(5):
        o, key = owner(f"user-{round_ % 2}"), f"click-{round_}"
        answers = stampede(clients, lambda i, c: submit(c, o, key, "gpu-east", PARAMS))
        for a in answers:
            assert not isinstance(a, Exception), f"an identical submit never fails: {a}"
            assert a["job_id"] == job_id_of(o, key), "every caller names the job the client derives"
            assert (a["state"], a["version"], a["result"]) == ("pending", 1, None)
        assert sum(a["created"] for a in answers) == 1, "exactly one caller creates the job"
        assert rows_for(operator, o, key) == 1
        job = job_row(operator, job_id_of(o, key))
        assert (job["state"], job["version"], job["params"]) == ("pending", 1, PARAMS)
        assert events(operator, job_id_of(o, key)) == [], "submits log nothing"


@pytest.mark.parametrize("finish", ["commit", "rollback"])
def test_double_click_submits_queued_behind_an_uncommitted_insert_all_get_that_job(connect, finish):
    """The deterministic version: the first submit's transaction is open, so the others provably
    wait on the unique index (seen in pg_stat_activity), then answer from the committed row."""
    holder, watcher = connect("app"), connect("app")
    name = f"double_click_queued_{finish}"
    waiters = [connect("app", name) for _ in range(4)]
    o, key = owner("carol"), f"checkout-{finish}"
    params = {"cart": [1, 2, 3]}

    holder.execute("BEGIN")
    first = submit(holder, o, key, "stripe", params)
    assert first["created"]
    pending = at_once(waiters, lambda i, c: submit(c, o, key, "stripe", params))
    wait_for_lock_waiters(watcher, name, len(waiters))
    holder.execute(finish.upper())
    answers = join(*pending)
    assert all(a["job_id"] == job_id_of(o, key) for a in answers), answers
    created = sum(a["created"] for a in answers)
    if finish == "commit":
        assert created == 0, "the holder created it; everyone else replays"
    else:
        assert created == 1, "the holder rolled back: exactly one waiter creates the job"


# --- failure point 2: the same key with a different input ---------------------------------------


def variant(mask):
    """A fingerprint: bit 1 changes the provider, bit 2 the params, bit 4 the contract."""
    return (
        "gpu-west" if mask & 1 else "gpu-east",
        {"prompt": "a cat", "size": [512, 512], "opts": {"seed": 8 if mask & 2 else 7}},
        "image-v1" if mask & 4 else None,
    )


def differing_fields(a, b):
    return [f for bit, f in ((1, "provider"), (2, "params"), (4, "contract")) if (a ^ b) & bit]


def assert_conflict(r, job_id, mine, theirs):
    fields = differing_fields(mine, theirs)
    assert r.sqlstate == "IJ001"
    assert r.detail == f"Job {job_id} exists with a different {', '.join(fields)}.", r
    assert r.facts == {"job_id": str(job_id), "fields": ",".join(fields)}, r
    assert "new idempotency key" in r.hint, r


def test_same_key_each_differing_field_is_named_and_the_job_is_unchanged(app, operator, contract):
    for original in (0, 4):  # the original without a contract, then with one
        o, key = owner("dave"), f"render-{original}"
        first = submit(app, o, key, *variant(original))
        assert first["created"]
        raw, before = job_row_raw(operator, first["job_id"]), digest(operator)
        for mask in range(8):
            if mask == original:
                continue
            r = refusal(lambda: submit(app, o, key, *variant(mask)), "IJ001")
            assert_conflict(r, first["job_id"], mask, original)
            assert key in r.message and o in r.message, r
        assert job_row_raw(operator, first["job_id"]) == raw, "the job row is not even rewritten"
        assert digest(operator) == before, "a refusal writes nothing"
        again = submit(app, o, key, *variant(original))
        assert (again["job_id"], again["created"]) == (first["job_id"], False), "the original still replays"


def test_same_key_equal_jsonb_is_the_same_intent_and_max_attempts_is_not_part_of_it(app, operator):
    o = owner("erin")
    sql = "SELECT job_id, created FROM intent.submit_job(%s, 'k', 'p', %s::jsonb, NULL, %s)"
    job_id, created = app.execute(sql, (o, '{"a": 1, "b": [1, 2], "c": {"x": null}}', 3)).fetchone()
    assert created and job_id == job_id_of(o, "k")
    raw = job_row_raw(operator, job_id)
    for text, max_attempts in [
        ('{"c":{"x":null},"b":[1,2],"a":1}', 3),
        ('{  "a" : 1.0 , "b" : [ 1.00, 2 ] , "c" : { "x" : null } }', 3),
        ('{"a": 1, "b": [1, 2], "c": {"x": null}}', 9),
    ]:
        assert app.execute(sql, (o, text, max_attempts)).fetchone() == (job_id, False), text
    for text in [
        '{"a": 1, "b": [2, 1], "c": {"x": null}}',
        '{"a": "1", "b": [1, 2], "c": {"x": null}}',
        '{"a": 1, "b": [1, 2], "c": {"x": null}, "d": 0}',
    ]:
        r = refusal(lambda: app.execute(sql, (o, text, 3)), "IJ001")
        assert r.detail == f"Job {job_id} exists with a different params.", text
        assert r.facts["fields"] == "params"
    assert job_row_raw(operator, job_id) == raw


def test_same_key_original_and_conflicting_submits_at_once(connect, operator, contract):
    """Whoever inserts first owns the key; every other caller is answered against that
    fingerprint: a replay if equal, IJ001 naming exactly the differing fields if not."""
    clients = [connect("app", "conflict_race") for _ in range(8)]
    o = owner("gina")
    for round_ in range(3):
        key = f"race-{round_}"
        answers = stampede(clients, lambda i, c: submit(c, o, key, *variant(i)))
        job = job_row(operator, job_id_of(o, key))
        winner = next(m for m in range(8) if variant(m) == (job["provider"], job["params"], job["contract"]))
        for mask, a in enumerate(answers):
            if mask == winner:
                assert a["created"] and a["job_id"] == job_id_of(o, key), a
            else:
                assert isinstance(a, psycopg.Error), f"fingerprint {mask} got {a}, the row holds {winner}"
                assert_conflict(Refusal(a), job_id_of(o, key), mask, winner)
        assert rows_for(operator, o, key) == 1


# --- failure point 3: the timeout ---------------------------------------------------------------


def test_timeout_mark_unknown_blocks_the_next_attempt_until_abandoned(app, operator):
    o = owner("ivy")
    s = submit(app, o, "gen-1", "gpu-east", {"prompt": "x"})
    a = begin(app, s["job_id"], "2 seconds")
    assert a["attempt_id"] == attempt_id_of(s["job_id"], 1)

    mark_unknown(app, a, "client gave up after 2s")
    assert attempt_row(operator, a["attempt_id"])["state"] == "unknown"
    job = job_row(operator, s["job_id"])
    assert (job["state"], job["version"], job["error"]) == ("unknown", 1, None), "never failed"
    (kind, attempt_id, detail), = events(operator, s["job_id"])
    assert (kind, attempt_id) == ("timeout", a["attempt_id"])
    assert (detail["cause"], detail["reason"]) == ("caller_timeout", "client gave up after 2s")

    # The gate stays shut: IJ003, whose facts name the blocking attempt; a replay says unknown.
    before = digest(operator)
    assert submit(app, o, "gen-1", "gpu-east", {"prompt": "x"})["state"] == "unknown"
    r = refusal(lambda: begin(app, s["job_id"]), "IJ003")
    assert str(a["attempt_id"]) in r.detail, r
    assert r.facts == {"job_id": str(s["job_id"]), "attempt_id": str(a["attempt_id"]), "attempt_state": "unknown"}
    assert "abandon_attempt" in r.hint, r
    assert heartbeat(app, a) is False, "an unknown attempt's worker should stop"
    assert digest(operator) == before, "none of that wrote anything"

    # Only the out-of-band decision opens it, and the application role may not make it.
    refusal(lambda: abandon(app, a, "not mine to decide"), "42501")
    abandon(operator, a, "reconciler: provider has no record of it")
    assert attempt_row(operator, a["attempt_id"])["state"] == "abandoned"
    assert job_row(operator, s["job_id"])["state"] == "pending"
    b = begin(app, s["job_id"])
    assert b == {"attempt_id": attempt_id_of(s["job_id"], 2), "attempt_no": 2, "version": 1}
    assert [e[0] for e in events(operator, s["job_id"])] == ["timeout", "abandoned"]


def test_timeout_a_lease_running_out_counts_as_unknown(app, operator):
    o = owner("jack")
    s = submit(app, o, "gen", "p", {})
    a = begin(app, s["job_id"], "2 seconds")
    r = refusal(lambda: begin(app, s["job_id"]), "IJ002")
    assert r.facts == {"job_id": str(s["job_id"]), "attempt_id": str(a["attempt_id"]), "attempt_state": "started"}

    wait_past_deadline(operator, a)
    before = digest(operator)
    replay = submit(app, o, "gen", "p", {})
    assert (replay["created"], replay["state"]) == (False, "unknown")
    r = refusal(lambda: begin(app, s["job_id"]), "IJ003")
    assert "lease ran out" in r.detail and str(a["attempt_id"]) in r.detail, r
    assert r.facts["attempt_state"] == "unknown" and r.facts["attempt_id"] == str(a["attempt_id"])
    assert digest(operator) == before, "reading under the deadline rule writes nothing"
    assert attempt_row(operator, a["attempt_id"])["state"] == "started", "not persisted yet"

    # The worker's heartbeat comes too late: stop, and now the tables say so.
    assert heartbeat(app, a, "1 minute") is False
    assert attempt_row(operator, a["attempt_id"])["state"] == "unknown"
    assert job_row(operator, s["job_id"])["state"] == "unknown"
    (kind, _, detail), = events(operator, s["job_id"])
    assert (kind, detail["cause"], detail["noticed_by"]) == ("timeout", "lease_expired", "heartbeat")
    refusal(lambda: begin(app, s["job_id"]), "IJ003")


def test_timeout_an_unknown_attempt_is_resolved_by_its_outcome(app, operator):
    o = owner("kim")
    # It really finished: its result wins, and the job is over (IJ004 from then on).
    s = submit(app, o, "late-success", "p", {})
    a = begin(app, s["job_id"])
    mark_unknown(app, a)
    refusal(lambda: begin(app, s["job_id"]), "IJ003")
    assert complete(app, a, {"url": "s3://a"}) == "won"
    job = job_row(operator, s["job_id"])
    assert (job["state"], job["version"], job["completed_by"]) == ("succeeded", 2, a["attempt_id"])
    r = refusal(lambda: begin(app, s["job_id"]), "IJ004")
    assert r.facts == {"job_id": str(s["job_id"]), "job_state": "succeeded", "version": "2"}

    # The provider said nothing happened: a definite failure reopens the gate.
    s = submit(app, o, "late-failure", "p", {})
    a = begin(app, s["job_id"])
    mark_unknown(app, a)
    assert fail(app, a, {"status": 503}) == "pending"
    assert attempt_row(operator, a["attempt_id"])["state"] == "failed"
    assert begin(app, s["job_id"])["attempt_no"] == 2


def test_timeout_racing_the_result_never_loses_it(connect, app, operator):
    """The caller's timer fires at the very moment the result arrives, on two connections:
    whichever lands first, the result wins and nothing is ever failed."""
    racers = [connect("app", "timeout_race") for _ in range(2)]
    o = owner("oli")
    for round_ in range(10):
        s = submit(app, o, f"k{round_}", "p", {})
        a = begin(app, s["job_id"])
        answers = stampede(
            racers, lambda i, c: mark_unknown(c, a, "timer") if i == 0 else complete(c, a, {"round": round_})
        )
        assert answers == [None, "won"], answers
        job = job_row(operator, s["job_id"])
        assert (job["state"], job["result"]) == ("succeeded", {"round": round_})
        assert attempt_row(operator, a["attempt_id"])["state"] == "succeeded"
        assert [e[0] for e in events(operator, s["job_id"])] in ([], ["timeout"])


# --- failure point 4: results arriving in reverse order -----------------------------------------


def a_abandoned_b_running(app, operator, key):
    """A job whose attempt A timed out and was abandoned, and whose attempt B is in flight."""
    o = owner("olga")
    s = submit(app, o, key, "gpu-east", {"prompt": key})
    a = begin(app, s["job_id"])
    mark_unknown(app, a, "client timeout")
    refusal(lambda: begin(app, s["job_id"]), "IJ003")
    abandon(operator, a, "user clicked the fallback button")
    b = begin(app, s["job_id"])
    assert (a["attempt_no"], b["attempt_no"]) == (1, 2)
    assert a["version"] == b["version"], "beginning an attempt does not change the version"
    return o, s["job_id"], a, b


def assert_outcome(operator, job_id, winner, winner_result, loser, loser_result):
    job = job_row(operator, job_id)
    assert (job["state"], job["result"], job["completed_by"]) == ("succeeded", winner_result, winner["attempt_id"])
    assert job["version"] == winner["version"] + 1, "one win, one version step"
    assert attempt_row(operator, winner["attempt_id"]) == {"state": "succeeded", "result": winner_result, "finished": True}
    assert attempt_row(operator, loser["attempt_id"]) == {
        "state": "discarded",
        "result": loser_result,
        "finished": True,
    }, "the late result is kept on its own row"
    late = [e for e in events(operator, job_id) if e[0] == "late_result"]
    assert len(late) == 1, f"the race is logged once: {late}"
    _, attempt_id, detail = late[0]
    assert attempt_id == loser["attempt_id"]
    assert detail["winner"] == str(winner["attempt_id"])
    assert (detail["presented_version"], detail["current_version"]) == (loser["version"], job["version"])


def test_reverse_order_b_returns_first_and_wins_then_a_loses(app, operator):
    o, job_id, a, b = a_abandoned_b_running(app, operator, "k")
    ra, rb = {"from": "A", "url": "s3://a"}, {"from": "B", "url": "s3://b"}
    assert complete(app, b, rb) == "won"
    after_win = job_row_raw(operator, job_id)
    assert complete(app, a, ra) == "lost"
    assert job_row_raw(operator, job_id) == after_win, "a loss leaves the job untouched"
    assert_outcome(operator, job_id, b, rb, a, ra)
    late = next(e for e in events(operator, job_id) if e[0] == "late_result")
    assert late[2]["attempt_state"] == "abandoned"

    # Asking again gives the same answers and changes nothing; the intent replays B's result.
    before = digest(operator)
    assert (complete(app, a, ra), complete(app, b, rb)) == ("lost", "won")
    assert digest(operator) == before
    replay = submit(app, o, "k", "gpu-east", {"prompt": "k"})
    assert (replay["state"], replay["result"]) == ("succeeded", rb)


def test_reverse_order_a_returns_first_and_wins_then_b_loses(app, operator):
    _, job_id, a, b = a_abandoned_b_running(app, operator, "k2")
    ra, rb = {"from": "A"}, {"from": "B"}
    assert complete(app, a, ra) == "won", "the abandoned attempt's work happened: first back, it wins"
    after_win = job_row_raw(operator, job_id)
    assert heartbeat(app, b) is False, "B is told to stop"
    assert complete(app, b, rb) == "lost"
    assert job_row_raw(operator, job_id) == after_win
    assert_outcome(operator, job_id, a, ra, b, rb)
    r = refusal(lambda: begin(app, job_id), "IJ004")
    assert r.facts["job_state"] == "succeeded"


def test_reverse_order_two_completions_at_once_have_exactly_one_winner(connect, app, operator):
    racers = [connect("app", "reverse_race") for _ in range(2)]
    for round_ in range(10):
        _, job_id, a, b = a_abandoned_b_running(app, operator, f"race-{round_}")
        attempts = [a, b]
        answers = stampede(racers, lambda i, c: complete(c, attempts[i], {"from": i}))
        assert sorted(answers) == ["lost", "won"], f"round {round_}: {answers}"
        w = answers.index("won")
        assert_outcome(operator, job_id, attempts[w], {"from": w}, attempts[1 - w], {"from": 1 - w})


def test_reverse_order_two_completions_queued_on_the_job_row_have_exactly_one_winner(connect, app, operator):
    """The deterministic version: a worker's heartbeat holds the job row in an open transaction,
    both completions provably queue behind it (pg_stat_activity), and when it commits one wins."""
    _, job_id, a, b = a_abandoned_b_running(app, operator, "queued")
    holder, watcher = connect("app"), connect("app")
    racers = [connect("app", "reverse_queued") for _ in range(2)]
    attempts = [a, b]
    with holder.transaction():
        assert heartbeat(holder, b) is True  # locks the job row until COMMIT
        pending = at_once(racers, lambda i, c: complete(c, attempts[i], {"from": i}))
        wait_for_lock_waiters(watcher, "reverse_queued", 2)
    answers = join(*pending)
    assert sorted(answers) == ["lost", "won"], answers
    w = answers.index("won")
    assert_outcome(operator, job_id, attempts[w], {"from": w}, attempts[1 - w], {"from": 1 - w})

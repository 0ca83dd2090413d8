"""The failure points against pg_intent, in plain SQL through psycopg: what an API handler and a
worker would call (submit_job, claim_attempts, complete_attempt, abandon_attempt).

Usage: python intent_behaviour.py CONNINFO   (prints one JSON line per scenario)
"""

import json
import sys
import threading
import time

import psycopg
from psycopg.types.json import Jsonb

from common import P1, P2, TRIALS, fail, report

SYSTEM = "pg_intent"
OWNER = "behaviour"


def connect():
    return psycopg.connect(sys.argv[1], autocommit=True)


def submit(c, key, params, provider="gpu-a"):
    return c.execute("SELECT job_id, created, state::text, result FROM intent.submit_job(%s, %s, %s, %s)",
                     (OWNER, key, provider, Jsonb(params))).fetchone()


def claim(c, provider, worker, lease="30 seconds"):
    return c.execute("SELECT attempt_id, version FROM intent.claim_attempts(ARRAY[%s], %s, %s)",
                     (provider, worker, lease)).fetchall()


def rows(c, key):
    return c.execute("SELECT count(*) FROM intent.jobs WHERE owner_id = %s AND idempotency_key = %s",
                     (OWNER, key)).fetchone()[0]


def attempts(c, key):
    return c.execute("SELECT count(*) FROM intent.attempts WHERE job_id = intent.job_id(%s, %s)",
                     (OWNER, key)).fetchone()[0]


def sqlstate(fn):
    try:
        fn()
        return "no error"
    except psycopg.Error as e:
        return f"{e.sqlstate} {e.diag.message_primary}"


def double_click(c):
    one_row = same_id = one_created = 0
    for t in range(TRIALS):
        key = f"dc-{t}"
        conns = [connect(), connect()]
        barrier = threading.Barrier(2)
        answers = [None, None]

        def click(i):
            barrier.wait()
            answers[i] = submit(conns[i], key, P1)

        threads = [threading.Thread(target=click, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for x in conns:
            x.close()
        one_row += rows(c, key) == 1
        same_id += answers[0][0] == answers[1][0]
        one_created += sorted([answers[0][1], answers[1][1]]) == [False, True]
    report(SYSTEM, "double_click",
           f"1 job in {one_row}/{TRIALS} trials; both callers got its id in {same_id}/{TRIALS}, "
           f"exactly one with created = true in {one_created}/{TRIALS}",
           one_row=one_row, same_id=same_id, one_created=one_created)


def different_payload(c):
    key = "dp"
    submit(c, key, P1)
    before = rows(c, key)
    err = sqlstate(lambda: submit(c, key, P2))
    after = rows(c, key)
    kept = c.execute("SELECT params = %s FROM intent.jobs WHERE owner_id = %s AND idempotency_key = %s",
                     (Jsonb(P1), OWNER, key)).fetchone()[0]
    report(SYSTEM, "different_payload",
           f"refused: {err}; rows {before} before, {after} after; "
           f"{'the job keeps the first payload' if kept else 'the payload changed'}",
           error=err, rows_before=before, rows_after=after, first_payload_kept=kept)


def while_running_and_after(c):
    key, provider = "wr", "beh-wr"
    submit(c, key, P1, provider)
    (att, ver), = claim(c, provider, "w1")
    again = submit(c, key, P1, provider)
    second_claim = claim(c, provider, "w2")
    begin = sqlstate(lambda: c.execute("SELECT * FROM intent.begin_attempt(intent.job_id(%s, %s))", (OWNER, key)))
    report(SYSTEM, "while_running",
           f"the same job back (created = {str(again[1]).lower()}, state {again[2]}); a second worker "
           f"claims {len(second_claim) or 'nothing'}, begin_attempt refuses ({begin}); {rows(c, key)} row, "
           f"{attempts(c, key)} attempt: it runs once",
           created=again[1], state=again[2], second_claims=len(second_claim), begin=begin,
           rows=rows(c, key), attempts=attempts(c, key))
    won = c.execute("SELECT intent.complete_attempt(%s, %s, %s)::text", (att, ver, Jsonb({"image": "one"}))).fetchone()[0]
    after = submit(c, key, P1, provider)
    claims = claim(c, provider, "w3")
    report(SYSTEM, "after_finished",
           f"the finished job back with its stored result (created = {str(after[1]).lower()}, state "
           f"{after[2]}, result {json.dumps(after[3])}); {len(claims) or 'nothing'} to claim; {rows(c, key)} row, "
           f"{attempts(c, key)} attempt: it ran once (until intent.purge removes it past intent.retention)",
           completion=won, created=after[1], state=after[2], claims=len(claims), rows=rows(c, key),
           attempts=attempts(c, key))


def timeout_and_late(c):
    # (a) The lease runs out, nobody reconciles: the late result is the outcome.
    key, provider = "to", "beh-to"
    submit(c, key, P1, provider)
    (att, ver), = claim(c, provider, "w1", "1 second")
    time.sleep(1.5)  # w1 hangs past its lease
    second = claim(c, provider, "w2")
    begin = sqlstate(lambda: c.execute("SELECT * FROM intent.begin_attempt(intent.job_id(%s, %s))", (OWNER, key)))
    state = submit(c, key, P1, provider)[2]
    listed = c.execute("SELECT count(*) FROM intent.attempts_to_reconcile WHERE attempt_id = %s", (att,)).fetchone()[0]
    report(SYSTEM, "worker_timeout",
           f"lease of 1 s (claim_attempts' lease; heartbeat extends it): once it ran out the attempt "
           f"counts as unknown, never failed; a second worker claims {len(second) or 'nothing'}, begin_attempt "
           f"refuses ({begin}), submit reports state {state}, and intent.attempts_to_reconcile lists it "
           f"({listed}): the job does not run again until someone reconciles or abandons the attempt",
           second_claims=len(second), begin=begin, state=state, listed=listed)
    late = c.execute("SELECT intent.complete_attempt(%s, %s, %s)::text", (att, ver, Jsonb({"image": "late"}))).fetchone()[0]
    final = submit(c, key, P1, provider)
    # (b) An operator abandons the attempt, a second attempt runs and wins; then the first reports.
    key2 = "to2"
    submit(c, key2, P1, provider)
    (a1, v1), = claim(c, provider, "w1", "1 second")
    time.sleep(1.5)
    c.execute("SELECT intent.abandon_attempt(%s, 'the worker hung')", (a1,))
    (a2, v2), = claim(c, provider, "w2")
    second = c.execute("SELECT intent.complete_attempt(%s, %s, %s)::text", (a2, v2, Jsonb({"image": "second"}))).fetchone()[0]
    late2 = c.execute("SELECT intent.complete_attempt(%s, %s, %s)::text", (a1, v1, Jsonb({"image": "late"}))).fetchone()[0]
    res = c.execute("SELECT result->>'image' FROM intent.jobs WHERE id = intent.job_id(%s, %s)", (OWNER, key2)).fetchone()[0]
    kept = c.execute("SELECT state::text, result->>'image' FROM intent.attempts WHERE id = %s", (a1,)).fetchone()
    events = c.execute("SELECT count(*) FROM intent.events WHERE attempt_id = %s AND kind = 'late_result'", (a1,)).fetchone()[0]
    report(SYSTEM, "late_result",
           f"nobody intervened: complete_attempt → {late}, the job {final[2]} with the late result "
           f"(1 attempt, ran once). After abandon_attempt and a second attempt that {second}: the late "
           f"result → {late2}, kept on its own attempt row ({kept[0]}, {kept[1]}), {events} late_result "
           f"event; the job's result stays the second's ({res})",
           late=late, final_state=final[2], abandoned_then=second, late_after_abandon=late2,
           job_result=res, late_attempt=list(kept), late_result_events=events)


def main():
    c = connect()
    for name, fn in (("double_click", double_click), ("different_payload", different_payload),
                     ("while_running", while_running_and_after), ("worker_timeout", timeout_and_late)):
        try:
            fn(c)
        except Exception as e:  # noqa: BLE001 - a failed scenario is a finding, the others still run
            fail(SYSTEM, name, e)


if __name__ == "__main__":
    main()

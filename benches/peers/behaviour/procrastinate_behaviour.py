"""The failure points against procrastinate, through its own client: a task deferred with a
queueing_lock (at most one job per lock in `todo`), real workers (App.run_worker_async), and its
documented recovery of stalled jobs (JobManager.get_stalled_jobs + retry_job, the body of the
"retry stalled jobs" periodic task of its docs).

Usage: PEERS_DSN=CONNINFO python procrastinate_behaviour.py   (prints one JSON line per finding)
"""

import asyncio
import logging

import psycopg
from procrastinate import exceptions

from common import P1, P2, TRIALS, fail, report
from procrastinate_peer import app

SYSTEM = "procrastinate (queueing_lock)"
executions = {}
holds = {}
errors = []
workers = []


def start_worker(**options):
    task = asyncio.create_task(app.run_worker_async(concurrency=1, install_signal_handlers=False,
                                                    fetch_job_polling_interval=0.2, **options))
    workers.append(task)
    return task


class Errors(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.ERROR:
            errors.append(record.getMessage())


logging.getLogger("procrastinate").addHandler(Errors())
logging.getLogger("procrastinate").setLevel(logging.ERROR)


@app.task(name="generate", pass_context=True)
async def generate(context, **kwargs):
    key = context.job.queueing_lock
    runs = executions.setdefault(key, [])
    runs.append((context.worker_name, context.job.id))
    hold = holds.get(key, [])
    if len(runs) <= len(hold):  # the first executions wait to be released, as a long provider call would
        await hold[len(runs) - 1].wait()


async def defer(key, params, queue="beh"):
    """The job's id, or the exception the client raised."""
    try:
        return await generate.configure(queueing_lock=key, queue=queue).defer_async(**params)
    except exceptions.AlreadyEnqueued as e:
        return e


def rows(c, key):
    return c.execute("SELECT count(*) FROM procrastinate_jobs WHERE queueing_lock = %s", (key,)).fetchone()[0]


async def until(cond, seconds=10):
    for _ in range(int(seconds * 20)):
        if cond():
            return
        await asyncio.sleep(0.05)


async def double_click(c):
    one_row = one_id = 0
    for t in range(TRIALS):
        key = f"dc-{t}"
        answers = await asyncio.gather(defer(key, P1), defer(key, P1))
        one_row += rows(c, key) == 1
        one_id += sum(isinstance(a, int) for a in answers) == 1
    report(SYSTEM, "double_click",
           f"1 job in {one_row}/{TRIALS} trials; one defer got its id and the other raised AlreadyEnqueued "
           f"in {one_id}/{TRIALS}: the second caller is not told which job holds its lock",
           one_row=one_row, one_id=one_id)


async def different_payload(c):
    key = "dp"
    await defer(key, P1)
    before = rows(c, key)
    second = await defer(key, P2)
    args = c.execute("SELECT args FROM procrastinate_jobs WHERE queueing_lock = %s", (key,)).fetchone()[0]
    report(SYSTEM, "different_payload",
           f"raised {type(second).__name__} (the same as for an identical job: the payload is not "
           f"compared); rows {before} before, {rows(c, key)} after, holding the "
           f"{'first payload' if args['prompt'] == P1['prompt'] else 'second payload'}",
           answer=type(second).__name__, rows_before=before, rows_after=rows(c, key), args=args)


async def while_running_and_after(c):
    key = "wr"
    holds[key] = [asyncio.Event()]
    worker = start_worker(queues=["beh-wr"], name="w")
    first = await defer(key, P1, "beh-wr")
    await until(lambda: len(executions.get(key, [])) == 1)
    again = await defer(key, P1, "beh-wr")
    third = await defer(key, P1, "beh-wr")
    while_rows = rows(c, key)
    holds[key][0].set()
    await until(lambda: len(executions.get(key, [])) == 2)
    await asyncio.sleep(0.5)
    report(SYSTEM, "while_running",
           f"a queueing lock holds only while the job waits (status todo): defer created job {again} "
           f"beside the running {first} (a third defer raised {type(third).__name__}); {while_rows} rows; "
           f"the task ran {len(executions[key])} times",
           created=isinstance(again, int), rows=while_rows, executions=len(executions[key]))
    after = await defer(key, P1, "beh-wr")
    await until(lambda: len(executions.get(key, [])) == 3)
    await asyncio.sleep(0.3)
    report(SYSTEM, "after_finished",
           f"a finished job holds no lock: defer created job {after}, which ran: "
           f"{len(executions[key])} executions of this key, {rows(c, key)} rows",
           created=isinstance(after, int), executions=len(executions[key]), rows=rows(c, key))


async def timeout_and_late(c):
    key = "to"
    holds[key] = [asyncio.Event(), asyncio.Event()]
    # Worker A's heartbeat stops after it registers (as a frozen or partitioned process's would):
    # update_heartbeat_interval of an hour. Its task hangs.
    a = start_worker(queues=["beh-to"], update_heartbeat_interval=3600, name="A")
    job_id = await defer(key, P1, "beh-to")
    await until(lambda: len(executions.get(key, [])) == 1)
    await asyncio.sleep(2)
    # The documented recovery, with a 1 s threshold instead of 30 s.
    stalled = await app.job_manager.get_stalled_jobs(queue="beh-to", seconds_since_heartbeat=1)
    for job in stalled:
        await app.job_manager.retry_job(job)
    b = start_worker(queues=["beh-to"], name="B")
    await until(lambda: len(executions.get(key, [])) == 2)
    status = c.execute("SELECT status, attempts FROM procrastinate_jobs WHERE id = %s", (job_id,)).fetchone()
    report(SYSTEM, "worker_timeout",
           "no per-job timeout: a job is stalled when its worker's heartbeat is older than a threshold "
           "(30 s by default; 1 s here), and retrying it is the application's job (get_stalled_jobs + "
           f"retry_job in a periodic task, as documented). {len(stalled)} stalled job found and retried; "
           f"worker B ran it while A's execution was still running: {len(executions[key])} executions "
           f"at once (status {status[0]}). A task that hangs in a worker that still heartbeats is never "
           "stalled: it holds its job as long as it hangs",
           stalled=len(stalled), executions=len(executions[key]), status=status[0])
    holds[key][0].set()  # A's task returns: A reports success for a job B is running
    await asyncio.sleep(1)
    after_a = c.execute("SELECT status FROM procrastinate_jobs WHERE id = %s", (job_id,)).fetchone()[0]
    n_errors = len(errors)
    holds[key][1].set()
    await asyncio.sleep(1)
    import gc
    gc.collect()
    after_b = c.execute("SELECT status FROM procrastinate_jobs WHERE id = %s", (job_id,)).fetchone()[0]
    report(SYSTEM, "late_result",
           f"accepted, unfenced: A's late finish set the job {after_a} while B was still running it; "
           f"B's own finish then {'failed' if len(errors) > n_errors else 'went through'} "
           f"({(errors[n_errors:] or ['no error'])[0].splitlines()[0][:100]}); status {after_b}, the task ran {len(executions[key])} times",
           status_after_late=after_a, status_final=after_b, errors=errors[n_errors:][:2])


async def main():
    import os
    c = psycopg.connect(os.environ["PEERS_DSN"], autocommit=True)
    # A worker's failure to record a job's end surfaces as an exception of its job's asyncio task.
    asyncio.get_running_loop().set_exception_handler(
        lambda loop, ctx: errors.append(str(getattr(ctx.get("exception"), "__cause__", None) or ctx.get("message"))))
    async with app.open_async():
        for name, fn in (("double_click", double_click), ("different_payload", different_payload),
                         ("while_running", while_running_and_after), ("worker_timeout", timeout_and_late)):
            try:
                await fn(c)
            except Exception as e:  # noqa: BLE001 - a failed scenario is a finding, the others still run
                fail(SYSTEM, name, e)
            finally:
                for ev in (e for evs in holds.values() for e in evs):
                    ev.set()
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                workers.clear()


if __name__ == "__main__":
    asyncio.run(main())

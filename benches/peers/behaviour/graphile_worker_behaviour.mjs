// The failure points against graphile-worker, through its own client: WorkerUtils.addJob with a
// jobKey in each jobKeyMode, and real worker pools (run()) executing a task.
//
// Usage: node graphile_worker_behaviour.mjs URL   (prints one JSON line per finding)
import pg from 'pg'
import { Logger, makeWorkerUtils, run } from 'graphile-worker'

const url = process.argv[2]
const SYSTEM = 'graphile-worker'
const P1 = { prompt: 'a cat in a hat', size: 512 }
const P2 = { prompt: 'a dog in a fog', size: 512 }
const TRIALS = 20
const MODES = ['replace', 'preserve_run_at', 'unsafe_dedupe']
const quiet = new Logger(() => () => {})
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

function report (system, scenario, observed, facts = {}) {
  console.log(JSON.stringify({ system, scenario, observed, facts }))
}
// A scenario that throws is a finding too; the others still run.
async function guard (system, scenario, fn) {
  try { await fn() } catch (err) { report(system, scenario, `the run itself failed: ${err}`); console.error(err) }
}

const db = new pg.Pool({ connectionString: url, max: 4 })
const q = async (text, values) => (await db.query(text, values)).rows
const rowsFor = async key => (await q('SELECT count(*)::int AS n FROM graphile_worker._private_jobs WHERE key = $1', [key]))[0].n
const utils = await makeWorkerUtils({ connectionString: url, logger: quiet })

// Every execution of the task, by job key; a key in `hold` makes its executions wait for a
// release, as a long provider call would.
const executions = {}
const hold = {}
const started = {}
function taskFor (label) {
  return async (payload, helpers) => {
    const key = helpers.job.key ?? payload.key
    ;(executions[key] ??= []).push({ pool: label, job: helpers.job.id, payload })
    started[key]?.()
    if (hold[key]) await hold[key].shift()?.promise
  }
}
function held (key, n) { // n executions of `key` will wait until released
  hold[key] = Array.from({ length: n }, () => { let release; const promise = new Promise(resolve => { release = resolve }); return { promise, release } })
  return hold[key].map(h => h.release)
}
function startedOnce (key) { return new Promise(resolve => { started[key] = resolve }) }
async function until (cond, ms = 5000) { const t = Date.now(); while (!(await cond()) && Date.now() - t < ms) await sleep(50) }

const poolA = await run({ connectionString: url, concurrency: 1, pollInterval: 100, noHandleSignals: true, logger: quiet, taskList: { behave: taskFor('A') } })

for (const mode of MODES) {
  const sys = `${SYSTEM} (${mode})`
  // 1. Double click: two concurrent addJob calls with one key. The worker is stopped from
  // picking them up by a run_at in the future.
  const runAt = new Date(Date.now() + 3600e3)
  await guard(sys, 'double_click', async () => {
  let oneRow = 0; let sameId = 0
  for (let t = 0; t < TRIALS; t++) {
    const key = `dc-${mode}-${t}`
    const [a, b] = await Promise.all([0, 1].map(() => utils.addJob('behave', { ...P1, key }, { jobKey: key, jobKeyMode: mode, runAt })))
    oneRow += (await rowsFor(key)) === 1
    sameId += String(a.id) === String(b.id)
  }
  report(sys, 'double_click', `1 job in ${oneRow}/${TRIALS} trials; both calls returned that job in ${sameId}/${TRIALS} (no error, no way to tell which call created it)`, { oneRow, sameId })
  })

  // 2. Same key, different payload (before it runs).
  await guard(sys, 'different_payload', async () => {
    const key = `dp-${mode}`
    await utils.addJob('behave', { ...P1, key }, { jobKey: key, jobKeyMode: mode, runAt })
    const before = await rowsFor(key)
    const second = await utils.addJob('behave', { ...P2, key }, { jobKey: key, jobKeyMode: mode, runAt })
    const [row] = await q('SELECT count(*) OVER ()::int AS n, payload, revision FROM graphile_worker._private_jobs WHERE key = $1', [key])
    const kept = row.payload.prompt === P1.prompt ? 'the first payload (the second is dropped)' : 'the second payload (the first is gone)'
    report(sys, 'different_payload', `accepted without an error (job ${second.id} returned); rows ${before} before, ${row.n} after, holding ${kept}, revision ${row.revision}`, { rowsBefore: before, rowsAfter: row.n, payload: row.payload, revision: row.revision })
  })

  // 3. Same key while the first job runs, then after it finished.
  await guard(sys, 'while_running', async () => {
    const key = `wr-${mode}`
    const [release] = held(key, 1)
    const running = startedOnce(key)
    const first = await utils.addJob('behave', { ...P1, key }, { jobKey: key, jobKeyMode: mode })
    await running
    const again = await utils.addJob('behave', { ...P1, key }, { jobKey: key, jobKeyMode: mode })
    const whileRows = (await q("SELECT count(*)::int AS n FROM graphile_worker._private_jobs WHERE key = $1 OR id = $2", [key, first.id]))[0].n
    release()
    await until(async () => (await q('SELECT count(*)::int AS n FROM graphile_worker._private_jobs WHERE key = $1 OR id = $2', [key, first.id]))[0].n === 0)
    await sleep(300)
    const ranWhile = executions[key].length
    report(sys, 'while_running', `${String(again.id) === String(first.id) ? 'the running job returned' : `a new job ${again.id} created beside the running ${first.id}`}; ${whileRows} job row(s) while it ran; the task ran ${ranWhile} time(s) in all`, { newJob: String(again.id) !== String(first.id), rowsWhileRunning: whileRows, executions: ranWhile })
    const after = await utils.addJob('behave', { ...P1, key }, { jobKey: key, jobKeyMode: mode })
    await until(async () => (executions[key]?.length ?? 0) > ranWhile)
    await sleep(200)
    report(sys, 'after_finished', `the finished job's row is gone (graphile-worker deletes a job when it succeeds), so a new job ${after.id} is created and the task runs again (${executions[key].length} executions of this key in all)`, { executions: executions[key].length })
  })
}

// 4. The worker hangs. graphile-worker has no per-job timeout or heartbeat: a job stays locked
// until `locked_at < now() - interval '4 hours'` (hard-coded in its resetLockedAt and get-job
// SQL), when a pool's periodic sweep (every 8-10 min by default) unlocks it. Four hours are
// simulated by moving locked_at back; a second pool sweeps every 200-300 ms.
await guard(SYSTEM, 'worker_timeout', async () => {
  const key = 'timeout'
  const [releaseFirst, releaseSecond] = held(key, 2)
  const running = startedOnce(key)
  await utils.addJob('behave', { ...P1, key }, { jobKey: key })
  await running
  await q("UPDATE graphile_worker._private_jobs SET locked_at = locked_at - interval '4 hours 1 second' WHERE key = $1", [key])
  const poolB = await run({ connectionString: url, concurrency: 1, pollInterval: 100, noHandleSignals: true, logger: quiet, minResetLockedInterval: 200, maxResetLockedInterval: 300, taskList: { behave: taskFor('B') } })
  await until(async () => (executions[key]?.length ?? 0) >= 2, 15000)
  const concurrent = executions[key].length
  const [row] = await q('SELECT locked_by, attempts FROM graphile_worker._private_jobs WHERE key = $1', [key])
  report(SYSTEM, 'worker_timeout', `locked_at + 4 h (hard-coded; simulated by moving locked_at back 4 h, with a pool sweeping stale locks every 200-300 ms): the sweep unlocked the job and a second pool ran it while the first was still running: ${concurrent} executions at once, attempts ${row?.attempts}`, { executionsAtOnce: concurrent, attempts: row?.attempts })
  releaseFirst()
  await sleep(500)
  const rowsAfterLate = await rowsFor(key)
  releaseSecond()
  await sleep(500)
  report(SYSTEM, 'late_result', `accepted, unfenced: the first worker's completion deleted the job (${rowsAfterLate} rows left) while the second was still running it; the second's completion then found nothing, without an error. The task ran ${executions[key].length} times; whichever result was written elsewhere last stands`, { rowsAfterLateCompletion: rowsAfterLate, executions: executions[key].length })
  await poolB.stop()
})

await poolA.stop()
await utils.release()
await db.end()

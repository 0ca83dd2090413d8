// The failure points against pg-boss, through its own client: send() with a singletonKey on
// queues with the `exclusive` policy (one job per key among created, retry and active), work()
// and fetch()/complete() as its workers use them, and its supervisor's expireInSeconds.
//
// Usage: node pg_boss_behaviour.mjs URL   (prints one JSON line per finding)
import { PgBoss } from 'pg-boss'

const url = process.argv[2]
const SYSTEM = 'pg-boss (exclusive)'
const P1 = { prompt: 'a cat in a hat', size: 512 }
const P2 = { prompt: 'a dog in a fog', size: 512 }
const TRIALS = 20
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))
function report (system, scenario, observed, facts = {}) {
  console.log(JSON.stringify({ system, scenario, observed, facts }))
}
async function guard (system, scenario, fn) {
  try { await fn() } catch (err) { report(system, scenario, `the run itself failed: ${err}`); console.error(err) }
}
async function until (cond, ms = 10000) { const t = Date.now(); while (!(await cond()) && Date.now() - t < ms) await sleep(100) }

// The supervisor (which expires jobs) every second, the shortest it allows.
const boss = new PgBoss({ connectionString: url, superviseIntervalSeconds: 1, monitorIntervalSeconds: 1, schedule: false })
boss.on('error', () => {})
await boss.start()
const db = boss.getDb()
const q = async (text, values) => (await db.executeSql(text, values)).rows
const rowsFor = async (name, key) => (await q('SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1 AND singleton_key = $2', [name, key]))[0].n

await boss.createQueue('beh', { policy: 'exclusive' })
const executions = {}
const hold = {}
function held (key) { let release; hold[key] = new Promise(resolve => { release = resolve }); return release }
async function handler ([job]) {
  const runs = (executions[job.singletonKey] ??= [])
  runs.push(job.id)
  const n = runs.length
  await hold[job.singletonKey]
  if (n === 1) await sleep(100) // the first (hung) execution returns last
  return { image: `execution ${n}` }
}

await guard(SYSTEM, 'double_click', async () => {
  let oneRow = 0; let oneId = 0
  for (let t = 0; t < TRIALS; t++) {
    const key = `dc-${t}`
    const ids = await Promise.all([0, 1].map(() => boss.send('beh', P1, { singletonKey: key })))
    oneRow += (await rowsFor('beh', key)) === 1
    oneId += ids.filter(Boolean).length === 1
  }
  report(SYSTEM, 'double_click', `1 job in ${oneRow}/${TRIALS} trials; one send() got its id and the other null in ${oneId}/${TRIALS}: the second caller is not told which job holds its key`, { oneRow, oneId })
})

await guard(SYSTEM, 'different_payload', async () => {
  const key = 'dp'
  await boss.send('beh', P1, { singletonKey: key })
  const before = await rowsFor('beh', key)
  const second = await boss.send('beh', P2, { singletonKey: key })
  const [row] = await q('SELECT count(*) OVER ()::int AS n, data FROM pgboss.job WHERE name = $1 AND singleton_key = $2', ['beh', key])
  report(SYSTEM, 'different_payload', `send() returned ${second} without an error; rows ${before} before, ${row.n} after, holding the ${row.data.prompt === P1.prompt ? 'first payload: the second is dropped silently' : 'second payload'}`, { returned: second, rowsBefore: before, rowsAfter: row.n, data: row.data })
})

await boss.createQueue('beh-wr', { policy: 'exclusive' })
await boss.work('beh-wr', { pollingIntervalSeconds: 0.5, includeMetadata: true }, handler)
await guard(SYSTEM, 'while_running', async () => {
  const key = 'wr'
  const release = held(key)
  const first = await boss.send('beh-wr', P1, { singletonKey: key })
  await until(async () => executions[key]?.length === 1)
  const again = await boss.send('beh-wr', P1, { singletonKey: key })
  const whileRows = await rowsFor('beh-wr', key)
  release()
  await until(async () => (await q("SELECT state FROM pgboss.job WHERE id = $1", [first]))[0].state === 'completed')
  await sleep(1200)
  report(SYSTEM, 'while_running', `send() returned ${again} (the active job holds the key); ${whileRows} row; the task ran ${executions[key].length} time(s)`, { returned: again, rows: whileRows, executions: executions[key].length })
  const after = await boss.send('beh-wr', P1, { singletonKey: key })
  await until(async () => executions[key].length > 1)
  await sleep(300)
  report(SYSTEM, 'after_finished', `a completed job no longer holds its key: send() created job ${after}, which ran: ${executions[key].length} executions of this key, ${await rowsFor('beh-wr', key)} rows`, { returned: after, executions: executions[key].length })
})

// The worker hangs: the job's expireInSeconds (1 s here; 15 min by default) runs out, the
// supervisor fails it, and with retries left it is retried.
await boss.createQueue('beh-to', { policy: 'exclusive', expireInSeconds: 1, retryLimit: 1, retryDelay: 0 })
await guard(SYSTEM, 'worker_timeout', async () => {
  const key = 'to'
  const release = held(key)
  const id = await boss.send('beh-to', P1, { singletonKey: key })
  await boss.work('beh-to', { pollingIntervalSeconds: 0.5, localConcurrency: 2, includeMetadata: true }, handler)
  await until(async () => (executions[key]?.length ?? 0) >= 2, 15000)
  const [row] = await q('SELECT state, retry_count, output FROM pgboss.job WHERE id = $1', [id])
  report(SYSTEM, 'worker_timeout', `expireInSeconds 1 s (15 min by default): the job was failed ("${row.output?.value?.message ?? row.output?.message ?? JSON.stringify(row.output)}": work()'s own timer; the supervisor, here every 1 s, does the same for a worker that died) and retried, so it ran again while the first execution was still running: ${executions[key].length} executions at once, retry_count ${row.retry_count}, state ${row.state}`, { executions: executions[key].length, retryCount: row.retry_count, state: row.state })
  release()
  await until(async () => (await q('SELECT state FROM pgboss.job WHERE id = $1', [id]))[0].state === 'completed')
  await sleep(500)
  const [done] = await q('SELECT state, output FROM pgboss.job WHERE id = $1', [id])
  // The late report, by a worker that fetched the job itself and completes it after its expiry
  // and retry, while the retry is running elsewhere.
  await boss.offWork('beh-to')
  const id3 = await boss.send('beh-to', P1, { singletonKey: 'to3' })
  const [first] = await boss.fetch('beh-to')
  await until(async () => (await q('SELECT state FROM pgboss.job WHERE id = $1', [id3]))[0].state === 'retry', 10000)
  const [second] = await boss.fetch('beh-to')
  const fenced = await boss.complete('beh-to', first, { image: 'late' })
  const plain = await boss.complete('beh-to', first.id, { image: 'late' })
  const [after] = await q('SELECT state, output FROM pgboss.job WHERE id = $1', [id3])
  report(SYSTEM, 'late_result', `work() ignored the hung first execution's late return: the job ended ${done.state} with the retry's result (${JSON.stringify(done.output)}). With the job object fetch() returned, a late completion is fenced to its attempt: complete(name, job) affected ${fenced.affected}. With a plain id, complete(name, id) is not fenced: it affected ${plain.affected} and completed the job (state ${after.state}, output ${JSON.stringify(after.output)}) while the retry${second ? ' fetched by another worker' : ''} was still running`, { finalOutput: done.output, fencedAffected: fenced.affected, plainAffected: plain.affected, stateAfter: after.state, secondFetched: !!second })
})

await boss.stop({ graceful: false, wait: true })

// pg-boss's schema, made by its own start(); the queue the benchmark sends to, with the
// `exclusive` policy (pg-boss's strictest deduplication: one job per singletonKey among created,
// retry and active jobs, by the unique index job_i6); and the exact statement and parameter that
// send(name, data, { singletonKey }) issues, captured through send()'s own `db` option and
// printed as JSON for benches/peers/run.py to turn into a pgbench script.
import { PgBoss } from 'pg-boss'

const url = process.argv[2]
const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false })
boss.on('error', err => console.error(err))
await boss.start()
await boss.createQueue('generate', { policy: 'exclusive' })
let captured = null
const inner = boss.getDb()
const db = {
  async executeSql (text, values) {
    captured = { text, values }
    return inner.executeSql(text, values)
  }
}
const id = await boss.send('generate', { prompt: 'a cat in a hat', size: 512 }, { singletonKey: 'CAPTURED-KEY', db })
if (!id || !captured) throw new Error('send() did not insert through the captured db')
await inner.executeSql('DELETE FROM pgboss.job WHERE id = $1', [id])
await boss.stop({ graceful: false, wait: true })
console.log(JSON.stringify(captured))

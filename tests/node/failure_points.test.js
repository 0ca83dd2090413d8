// The four failure points of pg_intent, from Node.js over node-postgres, through the SQL API alone.
//
// The same claims as tests/tests/{double_click,same_key_different_input,timeout,
// reverse_order_finish}.rs, made by a client that knows nothing of Rust: it derives job ids
// itself, matches SQLSTATEs by code (err.code), and reads the DETAIL, its facts line and the HINT
// (err.detail, err.hint) as docs/reference.md § 6 describes them. Every protocol call is made by
// an ordinary role in intent_app; an intent_operator role abandons attempts and reads the tables.
// Concurrent claims use real concurrent connections, one client each, with Promise.all.
//
// scripts/lang_tests.sh sets up the cluster: PGHOST, PGPORT and PGDATABASE, and the roles in
// PG_INTENT_APP_ROLE, PG_INTENT_OPERATOR_ROLE and PG_INTENT_ADMIN_ROLE.

import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';

if (!process.env.PGHOST || !process.env.PGPORT) {
  throw new Error('PGHOST and PGPORT are not set: run bash scripts/lang_tests.sh');
}
const ROLES = {
  app: process.env.PG_INTENT_APP_ROLE ?? 'intent_lang_app',
  operator: process.env.PG_INTENT_OPERATOR_ROLE ?? 'intent_lang_operator',
  admin: process.env.PG_INTENT_ADMIN_ROLE ?? 'intent_lang_admin',
};
// Every run names its own owners, so the suite can run again against the same database.
const RUN = randomUUID().slice(0, 8);
const owner = (name) => `${name}-${RUN}`;

// --- connections -------------------------------------------------------------------------------

const opened = [];
async function connect(kind = 'app', applicationName = 'pg_intent_node') {
  const c = new pg.Client({ user: ROLES[kind], application_name: applicationName, statement_timeout: 60000 });
  await c.connect();
  opened.push(c);
  return c;
}
const connectMany = (n, kind, name) => Promise.all(Array.from({ length: n }, () => connect(kind, name)));

let app, operator;
before(async () => {
  [app, operator] = [await connect('app'), await connect('operator')];
  const admin = await connect('admin');
  await admin.query(`SELECT intent.define_contract('image-v1', '{}'::jsonb)`);
});
after(() => Promise.all(opened.map((c) => c.end())));

// --- the SQL API -------------------------------------------------------------------------------

// The job id docs/reference.md § 1.4 derives: SHA-256(owner ‖ 0x00 ‖ key), first 16 bytes, UUID version 8,
// RFC 9562 variant, last two bytes zero (README § "The SQL API at a glance").
function uuidText(b) {
  const h = Buffer.from(b).toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
function jobIdOf(ownerId, key) {
  const b = createHash('sha256').update(ownerId).update(Buffer.from([0])).update(key).digest().subarray(0, 16);
  b[6] = (b[6] & 0x0f) | 0x80;
  b[8] = (b[8] & 0x3f) | 0x80;
  b[14] = b[15] = 0;
  return uuidText(b);
}
function attemptIdOf(jobId, n) {
  return jobId.slice(0, -4) + n.toString(16).padStart(4, '0');
}

// jsonb goes as JSON text (node-postgres would send a JS array as a PostgreSQL array); bigint
// comes back as a string, turned into a number here.
async function submit(c, ownerId, key, provider, params, contract = null, maxAttempts = 3) {
  const { rows } = await c.query(
    `SELECT job_id, created, state::text, version, result FROM intent.submit_job($1, $2, $3, $4::jsonb, $5, $6)`,
    [ownerId, key, provider, JSON.stringify(params), contract, maxAttempts],
  );
  return { ...rows[0], version: Number(rows[0].version) };
}
async function begin(c, jobId, lease = '1 minute') {
  const { rows } = await c.query(
    `SELECT attempt_id, attempt_no, version FROM intent.begin_attempt($1, lease => $2::interval)`,
    [jobId, lease],
  );
  return { ...rows[0], version: Number(rows[0].version) };
}
const one = async (c, sql, args) => Object.values((await c.query(sql, args)).rows[0])[0];
const complete = (c, a, result) =>
  one(c, `SELECT intent.complete_attempt($1, $2, $3::jsonb)::text`, [a.attempt_id, a.version, JSON.stringify(result)]);
const fail = (c, a, error, retryable = true) =>
  one(c, `SELECT intent.fail_attempt($1, $2, $3::jsonb, $4)::text`, [a.attempt_id, a.version, JSON.stringify(error), retryable]);
const markUnknown = (c, a, reason = null) => one(c, `SELECT intent.mark_unknown($1, $2)::text`, [a.attempt_id, reason]);
const heartbeat = (c, a, extend = null) => one(c, `SELECT intent.heartbeat($1, $2::interval)`, [a.attempt_id, extend]);
const abandon = (c, a, reason) => one(c, `SELECT intent.abandon_attempt($1, $2)::text`, [a.attempt_id, reason]);

// --- refusals: SQLSTATE, DETAIL, facts line, HINT -----------------------------------------------

// The DETAIL's sentence and its facts line (docs/reference.md § 6): the last line, when it starts
// with "Facts: ", holds key=value pairs separated by single spaces.
function splitFacts(detail) {
  const at = detail.lastIndexOf('\n');
  const last = detail.slice(at + 1);
  if (!last.startsWith('Facts: ')) return [detail, null];
  const facts = {};
  for (const pair of last.slice('Facts: '.length).split(' ')) {
    const eq = pair.indexOf('=');
    if (eq > 0) facts[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return [at < 0 ? '' : detail.slice(0, at), facts];
}

function asRefusal(err) {
  assert.ok(err instanceof pg.DatabaseError, `expected a server error, got ${err}`);
  const [detail, facts] = err.detail ? splitFacts(err.detail) : [undefined, null];
  return { code: err.code, severity: err.severity, message: err.message, detail, facts, hint: err.hint, file: err.file };
}

// Awaits a call that must be refused with exactly this SQLSTATE, and returns the refusal.
async function refusal(promise, code) {
  let answer;
  try {
    answer = await promise;
  } catch (err) {
    const r = asRefusal(err);
    assert.equal(r.code, code, `expected ${code}, got ${r.code}: ${r.message}`);
    assert.equal(r.severity, 'ERROR');
    if (code.startsWith('IJ')) {
      // The facts line is believed only from pg_intent itself (§ 6).
      assert.equal(r.file, 'pg_intent', JSON.stringify(r));
      assert.ok(r.message && r.detail && r.hint, `${code} has a message, DETAIL and HINT: ${JSON.stringify(r)}`);
    }
    return r;
  }
  assert.fail(`expected SQLSTATE ${code}, got an answer: ${JSON.stringify(answer)}`);
}

// --- reading the tables (intent_operator) -------------------------------------------------------

async function jobRow(op, jobId) {
  const { rows } = await op.query(
    `SELECT state::text, version, completed_by, result, error, provider, params, contract FROM intent.jobs WHERE id = $1`,
    [jobId],
  );
  assert.equal(rows.length, 1, `no job ${jobId}`);
  return { ...rows[0], version: Number(rows[0].version) };
}
// The row as stored, with its physical identity: equal before and after proves that a call did
// not even rewrite it.
const jobRowRaw = (op, jobId) =>
  one(op, `SELECT j.ctid::text || ' xmin=' || j.xmin::text || ' ' || j::text FROM intent.jobs j WHERE id = $1`, [jobId]);
async function attemptRow(op, attemptId) {
  const { rows } = await op.query(
    `SELECT state::text, result, finished_at IS NOT NULL AS finished FROM intent.attempts WHERE id = $1`,
    [attemptId],
  );
  assert.equal(rows.length, 1, `no attempt ${attemptId}`);
  return rows[0];
}
const events = async (op, jobId) =>
  (await op.query(`SELECT kind, attempt_id, detail FROM intent.events WHERE job_id = $1 ORDER BY id`, [jobId])).rows;
const kinds = async (op, jobId) => (await events(op, jobId)).map((e) => e.kind);
// Row counts and a digest of every row (with its physical identity) of the three tables.
const agg = (t) => `coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.${t} t), '')`;
const digest = async (op) =>
  (await op.query(
    `SELECT (SELECT count(*) FROM intent.jobs) jobs, (SELECT count(*) FROM intent.attempts) attempts,
            (SELECT count(*) FROM intent.events) events,
            md5(${agg('jobs')} || '#' || ${agg('attempts')} || '#' || ${agg('events')}) md5`,
  )).rows[0];
const rowsFor = (op, ownerId, key) =>
  one(op, `SELECT count(*)::int FROM intent.jobs WHERE owner_id = $1 AND idempotency_key = $2`, [ownerId, key]);

// Waits on the server's clock, so the test does not depend on two clocks agreeing.
async function waitPastDeadline(op, a) {
  for (let i = 0; i < 2400; i++) {
    if (await one(op, `SELECT deadline < clock_timestamp() FROM intent.attempts WHERE id = $1`, [a.attempt_id])) return;
    await sleep(25);
  }
  assert.fail(`attempt ${a.attempt_id} never ran out of lease`);
}

// Waits until n sessions named applicationName wait for a lock: proof that concurrent calls
// really are queued. The watcher is a session of the waiters' own role, which may see their wait
// events. On a Citus coordinator (the citus target) a session waits for a lock on a worker: it
// counts when citus_lock_waits, the wait graph of every node, names it.
async function waitForLockWaiters(watcher, applicationName, n) {
  const onCitus = await one(watcher, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`, []);
  const sql = onCitus
    ? `SELECT count(*)::int FROM citus_stat_activity WHERE application_name = $1
         AND (wait_event_type = 'Lock' OR global_pid IN (SELECT waiting_gpid FROM citus_lock_waits))`
    : `SELECT count(*)::int FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`;
  let waiting = 0;
  for (let i = 0; i < 1000; i++) {
    waiting = await one(watcher, sql, [applicationName]);
    if (waiting >= n) return;
    await sleep(20);
  }
  assert.fail(`only ${waiting} of ${n} sessions ${applicationName} wait for a lock`);
}

// Runs call(i, client) on every client at once (each query is written to its own connection in
// the same tick) and returns, in client order, each answer or the error it was refused with.
const atOnce = async (clients, call) =>
  (await Promise.allSettled(clients.map((c, i) => call(i, c)))).map((s) => (s.status === 'fulfilled' ? s.value : s.reason));
function noErrors(answers) {
  for (const a of answers) if (a instanceof Error) throw a;
  return answers;
}

// --- the ordinary role --------------------------------------------------------------------------

test('the calls are made by an ordinary intent_app role', async () => {
  assert.equal(await one(app, `SELECT current_setting('is_superuser')`), 'off');
  assert.equal(await one(app, `SELECT pg_has_role('intent_app', 'MEMBER')`), true);
  // It has exactly the application's calls: no table reads, no abandon_attempt.
  await refusal(app.query(`SELECT count(*) FROM intent.jobs`), '42501');
  await refusal(app.query(`SELECT intent.abandon_attempt($1, 'x')`, [randomUUID()]), '42501');
  assert.equal(await one(operator, `SELECT current_setting('is_superuser')`), 'off');
});

// --- failure point 1: the double click -----------------------------------------------------------

describe('double click', () => {
  const params = { prompt: 'a cat in a hat', size: [1024, 1024], seed: 42, nested: { a: [1, 2, { b: null }] } };

  test('identical submits at the same instant make one job', async () => {
    const clients = await connectMany(8, 'app', 'double_click');
    for (let round = 0; round < 5; round++) {
      const [o, key] = [owner(`user-${round % 2}`), `click-${round}`];
      const answers = noErrors(await atOnce(clients, (i, c) => submit(c, o, key, 'gpu-east', params)));
      for (const a of answers) {
        assert.equal(a.job_id, jobIdOf(o, key), 'every caller names the job the client derives');
        assert.deepEqual([a.state, a.version, a.result], ['pending', 1, null]);
      }
      assert.equal(answers.filter((a) => a.created).length, 1, 'exactly one caller creates the job');
      assert.equal(await rowsFor(operator, o, key), 1);
      const job = await jobRow(operator, jobIdOf(o, key));
      assert.deepEqual([job.state, job.version, job.params], ['pending', 1, params]);
      assert.deepEqual(await events(operator, jobIdOf(o, key)), [], 'submits log nothing');
    }
  });

  // The deterministic version: the first submit's transaction is open, so the others provably
  // wait on the unique index (seen in pg_stat_activity), then answer from the committed row.
  for (const finish of ['COMMIT', 'ROLLBACK']) {
    test(`submits queued behind an uncommitted insert all get that job (${finish})`, async () => {
      const [holder, watcher] = [await connect('app'), await connect('app')];
      const name = `double_click_queued_${finish}`;
      const waiters = await connectMany(4, 'app', name);
      const [o, key, p] = [owner('carol'), `checkout-${finish}`, { cart: [1, 2, 3] }];
      await holder.query('BEGIN');
      assert.equal((await submit(holder, o, key, 'stripe', p)).created, true);
      const pending = atOnce(waiters, (i, c) => submit(c, o, key, 'stripe', p));
      await waitForLockWaiters(watcher, name, waiters.length);
      await holder.query(finish);
      const answers = noErrors(await pending);
      assert.ok(answers.every((a) => a.job_id === jobIdOf(o, key)));
      const created = answers.filter((a) => a.created).length;
      if (finish === 'COMMIT') assert.equal(created, 0, 'the holder created it; everyone else replays');
      else assert.equal(created, 1, 'the holder rolled back: exactly one waiter creates the job');
      assert.equal(await rowsFor(operator, o, key), 1);
    });
  }
});

// --- failure point 2: the same key with a different input ----------------------------------------

describe('same key, different input', () => {
  // A fingerprint: bit 1 changes the provider, bit 2 the params, bit 4 the contract.
  const variant = (mask) => [
    mask & 1 ? 'gpu-west' : 'gpu-east',
    { prompt: 'a cat', size: [512, 512], opts: { seed: mask & 2 ? 8 : 7 } },
    mask & 4 ? 'image-v1' : null,
  ];
  const differingFields = (a, b) =>
    [[1, 'provider'], [2, 'params'], [4, 'contract']].filter(([bit]) => (a ^ b) & bit).map(([, f]) => f);

  function assertConflict(r, jobId, mine, theirs) {
    const fields = differingFields(mine, theirs);
    assert.equal(r.code, 'IJ001');
    assert.equal(r.detail, `Job ${jobId} exists with a different ${fields.join(', ')}.`);
    assert.deepEqual(r.facts, { job_id: jobId, fields: fields.join(',') });
    assert.match(r.hint, /new idempotency key/);
  }

  test('each differing field is named by IJ001 and the job is unchanged', async () => {
    for (const original of [0, 4]) {
      const [o, key] = [owner('dave'), `render-${original}`];
      const first = await submit(app, o, key, ...variant(original));
      assert.equal(first.created, true);
      const [raw, before] = [await jobRowRaw(operator, first.job_id), await digest(operator)];
      for (let mask = 0; mask < 8; mask++) {
        if (mask === original) continue;
        const r = await refusal(submit(app, o, key, ...variant(mask)), 'IJ001');
        assertConflict(r, first.job_id, mask, original);
        assert.ok(r.message.includes(key) && r.message.includes(o), r.message);
      }
      assert.equal(await jobRowRaw(operator, first.job_id), raw, 'the job row is not even rewritten');
      assert.deepEqual(await digest(operator), before, 'a refusal writes nothing');
      const again = await submit(app, o, key, ...variant(original));
      assert.deepEqual([again.job_id, again.created], [first.job_id, false], 'the original still replays');
    }
  });

  test('equal jsonb is the same intent, and max_attempts is not part of it', async () => {
    const o = owner('erin');
    const sql = `SELECT job_id, created FROM intent.submit_job($1, 'k', 'p', $2::jsonb, NULL, $3)`;
    const call = (text, maxAttempts = 3) => app.query(sql, [o, text, maxAttempts]).then((r) => r.rows[0]);
    const first = await call('{"a": 1, "b": [1, 2], "c": {"x": null}}');
    assert.deepEqual(first, { job_id: jobIdOf(o, 'k'), created: true });
    const raw = await jobRowRaw(operator, first.job_id);
    for (const [text, maxAttempts] of [
      ['{"c":{"x":null},"b":[1,2],"a":1}', 3],
      ['{  "a" : 1.0 , "b" : [ 1.00, 2 ] , "c" : { "x" : null } }', 3],
      ['{"a": 1, "b": [1, 2], "c": {"x": null}}', 9],
    ]) {
      assert.deepEqual(await call(text, maxAttempts), { job_id: first.job_id, created: false }, text);
    }
    for (const text of [
      '{"a": 1, "b": [2, 1], "c": {"x": null}}',
      '{"a": "1", "b": [1, 2], "c": {"x": null}}',
      '{"a": 1, "b": [1, 2], "c": {"x": null}, "d": 0}',
    ]) {
      const r = await refusal(call(text), 'IJ001');
      assert.equal(r.detail, `Job ${first.job_id} exists with a different params.`, text);
      assert.equal(r.facts.fields, 'params');
    }
    assert.equal(await jobRowRaw(operator, first.job_id), raw);
  });

  // Whoever inserts first owns the key; every other caller is answered against that fingerprint:
  // a replay if equal, IJ001 naming exactly the differing fields if not.
  test('the original and conflicting submits at once', async () => {
    const clients = await connectMany(8, 'app', 'conflict_race');
    const o = owner('gina');
    for (let round = 0; round < 3; round++) {
      const key = `race-${round}`;
      const answers = await atOnce(clients, (i, c) => submit(c, o, key, ...variant(i)));
      const job = await jobRow(operator, jobIdOf(o, key));
      const winner = [0, 1, 2, 3, 4, 5, 6, 7].find((m) => {
        const [provider, params, contract] = variant(m);
        return provider === job.provider && params.opts.seed === job.params.opts.seed && contract === job.contract;
      });
      assert.notEqual(winner, undefined, 'the row holds one of the submitted fingerprints');
      answers.forEach((a, mask) => {
        if (mask === winner) {
          assert.ok(!(a instanceof Error) && a.created && a.job_id === jobIdOf(o, key), String(a));
        } else {
          assert.ok(a instanceof pg.DatabaseError, `fingerprint ${mask} got ${JSON.stringify(a)}, the row holds ${winner}`);
          assertConflict(asRefusal(a), jobIdOf(o, key), mask, winner);
        }
      });
      assert.equal(await rowsFor(operator, o, key), 1);
    }
  });
});

// --- failure point 3: the timeout -----------------------------------------------------------------

describe('timeout', () => {
  test('mark_unknown blocks the next attempt until it is abandoned', async () => {
    const o = owner('ivy');
    const s = await submit(app, o, 'gen-1', 'gpu-east', { prompt: 'x' });
    const a = await begin(app, s.job_id, '2 seconds');
    assert.equal(a.attempt_id, attemptIdOf(s.job_id, 1));

    await markUnknown(app, a, 'client gave up after 2s');
    assert.equal((await attemptRow(operator, a.attempt_id)).state, 'unknown');
    const job = await jobRow(operator, s.job_id);
    assert.deepEqual([job.state, job.version, job.error], ['unknown', 1, null], 'never failed');
    const ev = await events(operator, s.job_id);
    assert.equal(ev.length, 1);
    assert.deepEqual([ev[0].kind, ev[0].attempt_id], ['timeout', a.attempt_id]);
    assert.deepEqual([ev[0].detail.cause, ev[0].detail.reason], ['caller_timeout', 'client gave up after 2s']);

    // The gate stays shut: IJ003, whose facts name the blocking attempt; a replay says unknown.
    const before = await digest(operator);
    assert.equal((await submit(app, o, 'gen-1', 'gpu-east', { prompt: 'x' })).state, 'unknown');
    const r = await refusal(begin(app, s.job_id), 'IJ003');
    assert.ok(r.detail.includes(a.attempt_id), r.detail);
    assert.deepEqual(r.facts, { job_id: s.job_id, attempt_id: a.attempt_id, attempt_state: 'unknown' });
    assert.match(r.hint, /abandon_attempt/);
    assert.equal(await heartbeat(app, a), false, "an unknown attempt's worker should stop");
    assert.deepEqual(await digest(operator), before, 'none of that wrote anything');

    // Only the out-of-band decision opens it, and the application role may not make it.
    await refusal(abandon(app, a, 'not mine to decide'), '42501');
    await abandon(operator, a, 'reconciler: provider has no record of it');
    assert.equal((await attemptRow(operator, a.attempt_id)).state, 'abandoned');
    assert.equal((await jobRow(operator, s.job_id)).state, 'pending');
    assert.deepEqual(await begin(app, s.job_id), { attempt_id: attemptIdOf(s.job_id, 2), attempt_no: 2, version: 1 });
    assert.deepEqual(await kinds(operator, s.job_id), ['timeout', 'abandoned']);
  });

  test('a lease running out counts as unknown', async () => {
    const o = owner('jack');
    const s = await submit(app, o, 'gen', 'p', {});
    const a = await begin(app, s.job_id, '2 seconds');
    let r = await refusal(begin(app, s.job_id), 'IJ002');
    assert.deepEqual(r.facts, { job_id: s.job_id, attempt_id: a.attempt_id, attempt_state: 'started' });

    await waitPastDeadline(operator, a);
    const before = await digest(operator);
    const replay = await submit(app, o, 'gen', 'p', {});
    assert.deepEqual([replay.created, replay.state], [false, 'unknown']);
    r = await refusal(begin(app, s.job_id), 'IJ003');
    assert.ok(r.detail.includes('lease ran out') && r.detail.includes(a.attempt_id), r.detail);
    assert.deepEqual([r.facts.attempt_id, r.facts.attempt_state], [a.attempt_id, 'unknown']);
    assert.deepEqual(await digest(operator), before, 'reading under the deadline rule writes nothing');
    assert.equal((await attemptRow(operator, a.attempt_id)).state, 'started', 'not persisted yet');

    // The worker's heartbeat comes too late: stop, and now the tables say so.
    assert.equal(await heartbeat(app, a, '1 minute'), false);
    assert.equal((await attemptRow(operator, a.attempt_id)).state, 'unknown');
    assert.equal((await jobRow(operator, s.job_id)).state, 'unknown');
    const ev = await events(operator, s.job_id);
    assert.equal(ev.length, 1);
    assert.deepEqual([ev[0].kind, ev[0].detail.cause, ev[0].detail.noticed_by], ['timeout', 'lease_expired', 'heartbeat']);
    await refusal(begin(app, s.job_id), 'IJ003');
  });

  test('an unknown attempt is resolved by its outcome', async () => {
    const o = owner('kim');
    // It really finished: its result wins, and the job is over (IJ004 from then on).
    let s = await submit(app, o, 'late-success', 'p', {});
    let a = await begin(app, s.job_id);
    await markUnknown(app, a);
    await refusal(begin(app, s.job_id), 'IJ003');
    assert.equal(await complete(app, a, { url: 's3://a' }), 'won');
    const job = await jobRow(operator, s.job_id);
    assert.deepEqual([job.state, job.version, job.completed_by], ['succeeded', 2, a.attempt_id]);
    const r = await refusal(begin(app, s.job_id), 'IJ004');
    assert.deepEqual(r.facts, { job_id: s.job_id, job_state: 'succeeded', version: '2' });

    // The provider said nothing happened: a definite failure reopens the gate.
    s = await submit(app, o, 'late-failure', 'p', {});
    a = await begin(app, s.job_id);
    await markUnknown(app, a);
    assert.equal(await fail(app, a, { status: 503 }), 'pending');
    assert.equal((await attemptRow(operator, a.attempt_id)).state, 'failed');
    assert.equal((await begin(app, s.job_id)).attempt_no, 2);
  });

  // The caller's timer fires at the very moment the result arrives, on two connections: whichever
  // lands first, the result wins and nothing is ever failed.
  test('a timeout racing the result never loses it', async () => {
    const racers = await connectMany(2, 'app', 'timeout_race');
    const o = owner('oli');
    for (let round = 0; round < 10; round++) {
      const s = await submit(app, o, `k${round}`, 'p', {});
      const a = await begin(app, s.job_id);
      const answers = noErrors(
        await atOnce(racers, (i, c) => (i === 0 ? markUnknown(c, a, 'timer') : complete(c, a, { round }))),
      );
      assert.deepEqual(answers, ['', 'won']);
      const job = await jobRow(operator, s.job_id);
      assert.deepEqual([job.state, job.result], ['succeeded', { round }]);
      assert.equal((await attemptRow(operator, a.attempt_id)).state, 'succeeded');
      assert.ok(['', 'timeout'].includes((await kinds(operator, s.job_id)).join()));
    }
  });
});

// --- failure point 4: results arriving in reverse order -------------------------------------------

describe('reverse order finish', () => {
  // A job whose attempt A timed out and was abandoned, and whose attempt B is in flight.
  async function aAbandonedBRunning(key) {
    const o = owner('olga');
    const s = await submit(app, o, key, 'gpu-east', { prompt: key });
    const a = await begin(app, s.job_id);
    await markUnknown(app, a, 'client timeout');
    await refusal(begin(app, s.job_id), 'IJ003');
    await abandon(operator, a, 'user clicked the fallback button');
    const b = await begin(app, s.job_id);
    assert.deepEqual([a.attempt_no, b.attempt_no], [1, 2]);
    assert.equal(a.version, b.version, 'beginning an attempt does not change the version');
    return { o, jobId: s.job_id, a, b };
  }

  async function assertOutcome(jobId, [winner, winnerResult], [loser, loserResult]) {
    const job = await jobRow(operator, jobId);
    assert.deepEqual([job.state, job.result, job.completed_by], ['succeeded', winnerResult, winner.attempt_id]);
    assert.equal(job.version, winner.version + 1, 'one win, one version step');
    assert.deepEqual(await attemptRow(operator, winner.attempt_id), { state: 'succeeded', result: winnerResult, finished: true });
    assert.deepEqual(
      await attemptRow(operator, loser.attempt_id),
      { state: 'discarded', result: loserResult, finished: true },
      'the late result is kept on its own row',
    );
    const late = (await events(operator, jobId)).filter((e) => e.kind === 'late_result');
    assert.equal(late.length, 1, 'the race is logged once');
    assert.equal(late[0].attempt_id, loser.attempt_id);
    assert.equal(late[0].detail.winner, winner.attempt_id);
    assert.deepEqual([late[0].detail.presented_version, late[0].detail.current_version], [loser.version, job.version]);
    return late[0];
  }

  test('B returns first and wins, then A loses', async () => {
    const { o, jobId, a, b } = await aAbandonedBRunning('k');
    const [ra, rb] = [{ from: 'A', url: 's3://a' }, { from: 'B', url: 's3://b' }];
    assert.equal(await complete(app, b, rb), 'won');
    const afterWin = await jobRowRaw(operator, jobId);
    assert.equal(await complete(app, a, ra), 'lost');
    assert.equal(await jobRowRaw(operator, jobId), afterWin, 'a loss leaves the job untouched');
    const late = await assertOutcome(jobId, [b, rb], [a, ra]);
    assert.equal(late.detail.attempt_state, 'abandoned');

    // Asking again gives the same answers and changes nothing; the intent replays B's result.
    const before = await digest(operator);
    assert.deepEqual([await complete(app, a, ra), await complete(app, b, rb)], ['lost', 'won']);
    assert.deepEqual(await digest(operator), before);
    const replay = await submit(app, o, 'k', 'gpu-east', { prompt: 'k' });
    assert.deepEqual([replay.state, replay.result], ['succeeded', rb]);
  });

  test('A returns first and wins, then B loses', async () => {
    const { jobId, a, b } = await aAbandonedBRunning('k2');
    const [ra, rb] = [{ from: 'A' }, { from: 'B' }];
    assert.equal(await complete(app, a, ra), 'won', "the abandoned attempt's work happened: first back, it wins");
    const afterWin = await jobRowRaw(operator, jobId);
    assert.equal(await heartbeat(app, b), false, 'B is told to stop');
    assert.equal(await complete(app, b, rb), 'lost');
    assert.equal(await jobRowRaw(operator, jobId), afterWin);
    await assertOutcome(jobId, [a, ra], [b, rb]);
    const r = await refusal(begin(app, jobId), 'IJ004');
    assert.equal(r.facts.job_state, 'succeeded');
  });

  test('two completions at once have exactly one winner', async () => {
    const racers = await connectMany(2, 'app', 'reverse_race');
    for (let round = 0; round < 10; round++) {
      const { jobId, a, b } = await aAbandonedBRunning(`race-${round}`);
      const attempts = [a, b];
      const answers = noErrors(await atOnce(racers, (i, c) => complete(c, attempts[i], { from: i })));
      assert.deepEqual([...answers].sort(), ['lost', 'won'], `round ${round}: ${answers}`);
      const w = answers.indexOf('won');
      await assertOutcome(jobId, [attempts[w], { from: w }], [attempts[1 - w], { from: 1 - w }]);
    }
  });

  // The deterministic version: a worker's heartbeat holds the job row in an open transaction, both
  // completions provably queue behind it (pg_stat_activity), and when it commits one wins.
  test('two completions queued on the job row have exactly one winner', async () => {
    const { jobId, a, b } = await aAbandonedBRunning('queued');
    const [holder, watcher] = [await connect('app'), await connect('app')];
    const racers = await connectMany(2, 'app', 'reverse_queued');
    const attempts = [a, b];
    await holder.query('BEGIN');
    assert.equal(await heartbeat(holder, b), true); // locks the job row until COMMIT
    const pending = atOnce(racers, (i, c) => complete(c, attempts[i], { from: i }));
    await waitForLockWaiters(watcher, 'reverse_queued', 2);
    await holder.query('COMMIT');
    const answers = noErrors(await pending);
    assert.deepEqual([...answers].sort(), ['lost', 'won'], String(answers));
    const w = answers.indexOf('won');
    await assertOutcome(jobId, [attempts[w], { from: w }], [attempts[1 - w], { from: 1 - w }]);
  });
});

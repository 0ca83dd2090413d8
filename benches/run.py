#!/usr/bin/env python3
"""pg_intent benchmarks: pg_intent against what a user would write instead, measured in one run.

Starts a throwaway cluster (the extension must be installed: scripts/bench.sh does that), loads
the baselines of benches/sql/baselines.sql, runs the pgbench scripts of benches/pgbench/ with
several clients, and prints throughput, p50/p99 latency and the ratio of each pair, every pair
measured back to back in the same run, with synchronous_commit on and off. Pairs are run in
alternating order (A B B A …) and the ratio uses the sum over all rounds, so a drift of the
machine during the run hits both sides alike.

Usage: python3 benches/run.py [--quick] [--seconds N] [--clients N] [--markdown FILE]
       python3 benches/run.py --ab OLD_LIB [--seconds N] [--rounds N]
           the calls of this build against another build of the extension (OLD_LIB, a
           pg_intent.so with the same schema): the library file is swapped between runs, every
           pgbench run opens new connections, so each side runs in backends that loaded it
       python3 benches/run.py --workers [--quick] [--seconds N] [--rounds N] [--markdown FILE]
           the worker side: claim + complete throughput with 1, 4 and 16 workers, the cost of
           intent.notify on submit throughput at 8 clients, claim latency at 10k and at 5M
           finished jobs, and pickup latency with NOTIFY and with polling (the Rust bench
           client/benches/pickup.rs, built and run with cargo on this run's cluster)
       python3 benches/run.py --bound-claim [--quick] [--seconds N] [--rounds N] [--markdown FILE]
           a claim by a session bound to one owner whose queue is empty, with 400,000 pending
           jobs of other owners ÷ with none (its cost must not follow other owners' queues),
           and submit throughput with the index jobs_claimable_by_owner ÷ without it
       python3 benches/run.py --held-snapshot [--quick] [--rounds N] [--markdown FILE]
           claims of 20 while another session holds a snapshot from before 100,000 jobs were
           claimed ÷ the same claims on the same table vacuumed (issue 30: its cost must not grow
           with the row versions an old snapshot keeps alive), with the buffers it reads
       python3 benches/run.py --hot [--quick]
           what one lifecycle writes (issue 30, HOT): per table, the inserts, updates, HOT
           updates (their share) and deletes per job, for a direct lifecycle (submit, begin,
           complete) and a worker's (submit, claim, complete); and WAL per lifecycle ÷ the three
           bare statements
       python3 benches/run.py --majors "15:BIN 16:BIN ..." [--markdown FILE]
           the submit and lifecycle pairs on each major, one after the other in one run, each
           against its baselines on the same server, and each major's throughput against the
           first one's (PG_BIN-style bin directories; scripts/bench.sh --majors fills them in)
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PGBENCH_DIR = ROOT / "benches" / "pgbench"
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))

# libpq variables that could send a connection elsewhere (a service overrides PGHOST/PGPORT;
# PGHOSTADDR wins over PGHOST): the bench's superuser SQL must reach its own cluster only.
LIBPQ_ENV = {
    "PGSERVICE", "PGSERVICEFILE", "PGSYSCONFDIR", "PGHOSTADDR", "PGOPTIONS", "PGPASSWORD",
    "PGPASSFILE", "PGSSLMODE", "PGREQUIRESSL", "PGSSLCERT", "PGSSLKEY", "PGSSLROOTCERT",
    "PGSSLCRL", "PGGSSENCMODE", "PGTARGETSESSIONATTRS", "PGLOADBALANCEHOSTS", "PGCHANNELBINDING",
    "PGREQUIREAUTH", "PGCONNECT_TIMEOUT", "PGAPPNAME", "PGCLIENTENCODING", "PGHOST", "PGPORT",
    "PGUSER", "PGDATABASE",
}


def clean_environ():
    """The environment without any libpq connection variable."""
    return {k: v for k, v in os.environ.items() if k not in LIBPQ_ENV}



def as_postgres(cmd):
    """Commands that touch the cluster's files run as `postgres` when we are root."""
    return (["runuser", "-u", "postgres", "--"] + cmd) if os.geteuid() == 0 else cmd


class Cluster:
    def __init__(self, settings, bin_dir=None):
        self.bin = Path(bin_dir) if bin_dir else PG_BIN
        self.dir = Path(tempfile.mkdtemp(prefix="pg_intent_bench."))
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        data = self.dir / "data"
        subprocess.run(as_postgres([str(self.bin / "initdb"), "-D", str(data), "-U", "postgres",
                                    "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"]),
                       check=True, stdout=subprocess.DEVNULL)
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=''"
        for k, v in settings.items():
            opts += f" -c {k}={v}"
        subprocess.run(as_postgres([str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "log"),
                                    "-w", "-o", opts, "start"]), check=True, stdout=subprocess.DEVNULL)
        self.env = dict(clean_environ(), PGHOST=str(self.dir), PGPORT=str(self.port), PGUSER="postgres")

    def psql(self, sql, db="bench", file=None):
        cmd = [str(self.bin / "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", db]
        cmd += ["-f", str(file)] if file else ["-c", sql]
        return subprocess.run(cmd, env=self.env, check=True, capture_output=True, text=True).stdout.strip()

    def stop(self):
        subprocess.run(as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop"]),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


def pgbench(cluster, script, clients, seconds=None, transactions=None, sync=True, variables=None, options=""):
    """Runs one pgbench script; returns (tps, latencies in ms, failed transactions). `options`:
    more `-c name=value` settings for its sessions."""
    logdir = Path(tempfile.mkdtemp(prefix="pgbench."))
    cmd = [str(cluster.bin / "pgbench"), "-n", "-M", "prepared", "-c", str(clients),
           "-j", str(min(clients, 2)), "-f", str(PGBENCH_DIR / script),
           "-l", "--log-prefix", str(logdir / "log")]
    cmd += ["-T", str(seconds)] if seconds else ["-t", str(transactions)]
    for k, v in (variables or {}).items():
        cmd += ["-D", f"{k}={v}"]
    env = dict(cluster.env, PGOPTIONS=f"-c synchronous_commit={'on' if sync else 'off'} {options}".strip(),
               PGDATABASE="bench")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pgbench {script} failed:\n{out.stdout}\n{out.stderr}")
    tps = next(float(l.split("=")[1].split()[0]) for l in out.stdout.splitlines() if l.startswith("tps"))
    failed = 0
    for line in out.stdout.splitlines():
        if line.startswith("number of failed transactions"):
            failed = int(line.split(":")[1].split()[0])
    latencies = []
    for f in logdir.iterdir():
        for line in f.read_text().splitlines():
            parts = line.split()
            latencies.append(int(parts[2]) / 1000.0)
    shutil.rmtree(logdir, ignore_errors=True)
    return tps, latencies, failed


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


def compare(cluster, ours, base, clients, seconds, rounds, sync, variables=None):
    """Alternates ours and the baseline; returns summed tps and pooled latencies of each."""
    res = {ours: ([], []), base: ([], [])}
    order = [ours, base]
    for r in range(rounds):
        for script in (order if r % 2 == 0 else list(reversed(order))):
            tps, lat, failed = pgbench(cluster, script, clients, seconds=seconds, sync=sync, variables=variables)
            if failed:
                sys.exit(f"{script}: {failed} failed transactions")
            res[script][0].append(tps)
            res[script][1].extend(lat)
    return res


def wal_per_lifecycle(cluster, n):
    """WAL bytes per lifecycle of lifecycle.sql and of bare_lifecycle.sql, one method for every
    figure: each script first runs n lifecycles unmeasured (both tables and their indexes past
    their first pages), then each is measured over n more, alternately, twice, one client,
    synchronous_commit off, with no checkpoint in between (checkpoint_timeout and max_wal_size
    are this bench's, far above a run), so that full-page images, which follow checkpoints and
    not the calls, count for neither side. Returns (ours, bare, ours' full-page-image bytes,
    bare's) per lifecycle; the image bytes from pg_walinspect when the server has it, else None."""
    inspect = cluster.psql("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'") == "1"
    if inspect:
        cluster.psql("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    scripts = ("lifecycle.sql", "bare_lifecycle.sql")
    for script in scripts:
        pgbench(cluster, script, 1, transactions=n, sync=False)
    total = {s: 0.0 for s in scripts}
    images = {s: 0.0 for s in scripts}
    for r in range(2):
        for script in (scripts if r % 2 == 0 else tuple(reversed(scripts))):
            before = cluster.psql("SELECT pg_current_wal_insert_lsn()")
            pgbench(cluster, script, 1, transactions=n, sync=False)
            after = cluster.psql("SELECT pg_current_wal_insert_lsn()")
            total[script] += float(cluster.psql(f"SELECT pg_wal_lsn_diff('{after}', '{before}')"))
            if inspect:
                cluster.psql("SELECT pg_switch_wal()")  # flushed: pg_walinspect reads up to there
                images[script] += float(cluster.psql(
                    f"SELECT coalesce(sum(fpi_size), 0) FROM pg_get_wal_stats('{before}', '{after}')"))
    per = lambda d, s: d[s] / (2 * n)
    ours, bare = scripts
    return (per(total, ours), per(total, bare),
            per(images, ours) if inspect else None, per(images, bare) if inspect else None)


def load_jobs(cluster, n, prefix):
    """Adds n finished jobs, as fast as PostgreSQL can write them."""
    step = 200_000
    done = 0
    while done < n:
        m = min(step, n - done)
        cluster.psql(f"""
            INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, state, version,
                                     completed_by, result, attempt_count, created_at, updated_at)
            SELECT intent.job_id('load-' || (g % 1000), '{prefix}-' || g), 'load-' || (g % 1000), '{prefix}-' || g,
                   'gpu-a', '{{"prompt": "a cat in a hat", "size": 512}}', 'succeeded', 2,
                   intent.attempt_id(intent.job_id('load-' || (g % 1000), '{prefix}-' || g), 1),
                   '{{"image": "blob://cat.png"}}', 1, now(), now()
              FROM generate_series({done + 1}, {done + m}) g""")
        done += m
    cluster.psql("VACUUM ANALYZE intent.jobs")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="short runs, 1M instead of 5M jobs for the scale test")
    ap.add_argument("--seconds", type=int, default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="also write the results as Markdown")
    ap.add_argument("--majors", default=None, help="MAJOR:BIN pairs: the per-major comparison")
    ap.add_argument("--ab", type=Path, default=None, help="OLD_LIB: this build's calls against another build's")
    ap.add_argument("--workers", action="store_true", help="the worker benchmarks: claims, NOTIFY, pickup")
    ap.add_argument("--bound-claim", action="store_true", help="a bound claim against other owners' queues")
    ap.add_argument("--held-snapshot", action="store_true", help="a claim behind jobs claimed under a held snapshot")
    ap.add_argument("--hot", action="store_true", help="row versions, HOT updates and WAL per lifecycle")
    args = ap.parse_args()
    if args.workers:
        return workers(args)
    if args.bound_claim:
        return bound_claim(args)
    if args.held_snapshot:
        return held_snapshot(args)
    if args.hot:
        return hot(args)
    if args.majors:
        return majors(args)
    if args.ab:
        return ab(args)
    seconds = args.seconds or (5 if args.quick else 15)
    rounds = args.rounds or (2 if args.quick else 4)
    big = 1_000_000 if args.quick else 5_000_000
    clients = args.clients

    settings = {"shared_buffers": "1GB", "max_wal_size": "8GB", "checkpoint_timeout": "30min",
                "max_connections": "100", "fsync": "on"}
    cluster = Cluster(settings)
    rows = []
    try:
        cluster.psql("CREATE DATABASE bench", db="postgres")
        cluster.psql("CREATE EXTENSION pg_intent")
        cluster.psql(None, file=ROOT / "benches" / "sql" / "baselines.sql")

        def pair(label, ours, base, target, sync, variables=None, better="higher"):
            res = compare(cluster, ours, base, clients, seconds, rounds, sync, variables)
            o_tps, b_tps = sum(res[ours][0]), sum(res[base][0])
            ratio = o_tps / b_tps
            rows.append({
                "what": label, "sync": "on" if sync else "off",
                "ours_tps": o_tps / rounds, "base_tps": b_tps / rounds,
                "ours_p50": pct(res[ours][1], 50), "ours_p99": pct(res[ours][1], 99),
                "base_p50": pct(res[base][1], 50), "base_p99": pct(res[base][1], 99),
                "ratio": ratio, "target": target,
                "ok": (ratio >= target) if target is not None else None,
            })
            print_row(rows[-1])

        print(f"pg_intent benchmarks: {clients} clients, {rounds} rounds of {seconds}s per side, "
              f"pgbench -M prepared, {os.cpu_count()} CPUs", flush=True)
        print_header()
        keys = 100_000
        cluster.psql(f"""
            SELECT count(*) FROM generate_series(1, {keys}) g,
                   LATERAL intent.submit_job('replay-owner', 'replay-' || g, 'gpu-a',
                                             '{{"prompt": "a cat in a hat", "size": 512}}') s""")
        cluster.psql("INSERT INTO bench.jobs SELECT * FROM intent.jobs WHERE owner_id = 'replay-owner'")
        cluster.psql("VACUUM ANALYZE")
        for sync in (True, False):
            pair("submit, new keys ÷ raw INSERT … ON CONFLICT", "submit_new.sql", "raw_insert_new.sql", 0.90, sync)
            pair("  (for context) ÷ the same on a bare table", "submit_new.sql", "bare_insert_new.sql", None, sync)
            pair("submit replay ÷ raw SELECT by key", "submit_replay.sql", "raw_select_by_key.sql", 0.90, sync,
                 {"keys": keys})
            pair("lifecycle ÷ hand-written PL/pgSQL", "lifecycle.sql", "plpgsql_lifecycle.sql", 1.00, sync)
            pair("lifecycle ÷ the three bare statements", "lifecycle.sql", "bare_lifecycle.sql", 0.80, sync)

        n = 2000 if args.quick else 10000
        ours_wal, bare_wal, _, _ = wal_per_lifecycle(cluster, n)
        wal_ratio = ours_wal / bare_wal
        print(f"\nWAL per lifecycle (benches/run.py wal_per_lifecycle): pg_intent {ours_wal:.0f} B, bare statements "
              f"{bare_wal:.0f} B, ratio {wal_ratio:.2f} (target <= 1.15) {'OK' if wal_ratio <= 1.15 else 'MISSED'}")

        batch = {}
        for sync in (True, False):
            res = compare(cluster, "submit_batch_100.sql", "submit_single_100.sql", clients, seconds, rounds, sync)
            b = sum(res["submit_batch_100.sql"][0]) * 100 / rounds
            s = sum(res["submit_single_100.sql"][0]) * 100 / rounds
            batch["on" if sync else "off"] = (b, s, b / s)
            print(f"batch submit (synchronous_commit {'on' if sync else 'off'}), 100 per call: {b:.0f} jobs/s; "
                  f"100 single calls: {s:.0f} jobs/s; ratio {b / s:.1f}x (target >= 10x) "
                  f"{'OK' if b / s >= 10 else 'MISSED'}")

        # Latency at scale: p99 of submit with 10 thousand existing jobs, then with `big`.
        cluster.psql("TRUNCATE intent.jobs CASCADE; TRUNCATE intent.events")
        load_jobs(cluster, 10_000, "small")
        _, lat_small, _ = pgbench(cluster, "submit_new.sql", clients, seconds=seconds, sync=True)
        load_jobs(cluster, big - 10_000, "big")
        _, lat_big, _ = pgbench(cluster, "submit_new.sql", clients, seconds=seconds, sync=True)
        p99_ratio = pct(lat_big, 99) / pct(lat_small, 99)
        print(f"submit p99 with {big:,} jobs: {pct(lat_big, 99):.2f} ms; with 10,000: {pct(lat_small, 99):.2f} ms; "
              f"ratio {p99_ratio:.2f} (target <= 1.50) {'OK' if p99_ratio <= 1.5 else 'MISSED'}")

        # 32 clients hammering one key.
        _, lat, failed = pgbench(cluster, "hammer_one_key.sql", 32, seconds=seconds, sync=True)
        jobs = cluster.psql("SELECT count(*) FROM intent.jobs WHERE owner_id = 'hammer-owner'")
        print(f"32 clients on one key: {len(lat)} calls, {failed} errors, {jobs} job(s) "
              f"{'OK' if failed == 0 and jobs == '1' else 'MISSED'}")

        if args.markdown:
            write_markdown(args, rows, ours_wal, bare_wal, wal_ratio, batch, big, lat_small, lat_big,
                           p99_ratio, len(lat), failed, jobs, clients, seconds, rounds)
    finally:
        cluster.stop()


# The calls compared between two builds: every kind of call a client makes (a new submit, a
# replay, a whole lifecycle, a batch).
AB_SCRIPTS = [
    ("submit, new keys", "submit_new.sql", None),
    ("submit replay", "submit_replay.sql", {"keys": 100_000}),
    ("lifecycle (submit, begin, complete)", "lifecycle.sql", None),
    ("submit_jobs, 100 per call", "submit_batch_100.sql", None),
    ("retry (begin, heartbeat, fail, begin, complete)", "fail_retry.sql", None),
    ("unknown (begin, mark_unknown, abandon, cancel)", "unknown_abandon.sql", None),
]


def ab(args):
    """This build's calls against another build's, on one server: the library file is swapped
    (atomically) before each pgbench run, in alternating order, and the ratio is new ÷ old."""
    seconds = args.seconds or 10
    rounds = args.rounds or 4
    clients = args.clients
    libdir = Path(subprocess.run([str(PG_BIN / "pg_config"), "--pkglibdir"], check=True,
                                 capture_output=True, text=True).stdout.strip())
    live = libdir / "pg_intent.so"
    new_lib = Path(tempfile.mkdtemp(prefix="pg_intent_ab.")) / "new.so"
    shutil.copy2(live, new_lib)
    libs = {"new": new_lib, "old": args.ab}

    def use(side):
        tmp = libdir / ".pg_intent.so.ab"
        shutil.copy2(libs[side], tmp)
        os.replace(tmp, live)

    cluster = Cluster(SETTINGS)
    try:
        cluster.psql("CREATE DATABASE bench", db="postgres")
        cluster.psql("CREATE EXTENSION pg_intent")
        cluster.psql(None, file=ROOT / "benches" / "sql" / "baselines.sql")
        cluster.psql("""
            SELECT count(*) FROM generate_series(1, 100000) g,
                   LATERAL intent.submit_job('replay-owner', 'replay-' || g, 'gpu-a',
                                             '{"prompt": "a cat in a hat", "size": 512}') s""")
        cluster.psql("VACUUM ANALYZE")
        print(f"this build ÷ {args.ab}: {clients} clients, {rounds} rounds of {seconds}s per side, "
              f"alternating, pgbench -M prepared, {os.cpu_count()} CPUs", flush=True)
        print(f"{'call':40} {'sync':5} {'new tps':>10} {'old tps':>10} {'new p99':>8} {'old p99':>8} {'new÷old':>8}")
        worst = None
        for sync in (True, False):
            for label, script, variables in AB_SCRIPTS:
                res = {"new": ([], []), "old": ([], [])}
                for r in range(rounds):
                    for side in (("new", "old") if r % 2 == 0 else ("old", "new")):
                        use(side)
                        tps, lat, failed = pgbench(cluster, script, clients, seconds=seconds, sync=sync,
                                                   variables=variables)
                        if failed:
                            sys.exit(f"{script} ({side}): {failed} failed transactions")
                        res[side][0].append(tps)
                        res[side][1].extend(lat)
                ratio = sum(res["new"][0]) / sum(res["old"][0])
                worst = ratio if worst is None else min(worst, ratio)
                print(f"{label:40} {'on' if sync else 'off':5} {sum(res['new'][0]) / rounds:10.0f} "
                      f"{sum(res['old'][0]) / rounds:10.0f} {pct(res['new'][1], 99):8.2f} "
                      f"{pct(res['old'][1], 99):8.2f} {ratio:8.3f}", flush=True)
        print(f"\nslowest call, new ÷ old: {worst:.3f} (target >= 0.97) {'OK' if worst >= 0.97 else 'MISSED'}")
    finally:
        use("new")
        cluster.stop()


SETTINGS = {"shared_buffers": "1GB", "max_wal_size": "8GB", "checkpoint_timeout": "30min",
            "max_connections": "100", "fsync": "on"}

# The pairs measured on every major: what a user of each major pays for pg_intent.
MAJOR_PAIRS = [
    ("submit, new keys ÷ raw INSERT … ON CONFLICT", "submit_new.sql", "raw_insert_new.sql"),
    ("lifecycle ÷ hand-written PL/pgSQL", "lifecycle.sql", "plpgsql_lifecycle.sql"),
    ("lifecycle ÷ the three bare statements", "lifecycle.sql", "bare_lifecycle.sql"),
]


def majors(args):
    """Each major in turn, on a cluster of its own with the same settings: pg_intent against
    the baselines on that server, and its throughput against the first major's."""
    seconds = args.seconds or 5
    rounds = args.rounds or 2
    clients = args.clients
    results = {}  # major -> {(label, sync): (ours tps, base tps, ratio)}
    pairs = [p.split(":", 1) for p in args.majors.split()]
    print(f"pg_intent on each major: {clients} clients, {rounds} rounds of {seconds}s per side, "
          f"pgbench -M prepared, {os.cpu_count()} CPUs", flush=True)
    for major, bin_dir in pairs:
        cluster = Cluster(SETTINGS, bin_dir)
        try:
            version = None
            cluster.psql("CREATE DATABASE bench", db="postgres")
            cluster.psql("CREATE EXTENSION pg_intent")
            cluster.psql(None, file=ROOT / "benches" / "sql" / "baselines.sql")
            version = cluster.psql("SHOW server_version")
            results[major] = {"version": version}
            for sync in (True, False):
                for label, ours, base in MAJOR_PAIRS:
                    res = compare(cluster, ours, base, clients, seconds, rounds, sync)
                    o, b = sum(res[ours][0]) / rounds, sum(res[base][0]) / rounds
                    results[major][(label, sync)] = (o, b, o / b)
                    print(f"PostgreSQL {version:<6} {label:<40} sync {'on ' if sync else 'off'} "
                          f"ours {o:>7.0f} tps  base {b:>7.0f} tps  ratio {o / b:.2f}", flush=True)
        finally:
            cluster.stop()
    first = pairs[0][0]
    lines = [
        f"| PostgreSQL | synchronous_commit | {' | '.join(l for l, _, _ in MAJOR_PAIRS)} | pg_intent tps (submit / lifecycle) | ÷ PostgreSQL {results[first]['version']} |",
        "|---|---|" + "---:|" * len(MAJOR_PAIRS) + "---:|---:|",
    ]
    for major, _ in pairs:
        r = results[major]
        for sync in (True, False):
            ratios = " | ".join(f"{r[(l, sync)][2]:.2f}" for l, _, _ in MAJOR_PAIRS)
            sub, life = r[(MAJOR_PAIRS[0][0], sync)][0], r[(MAJOR_PAIRS[1][0], sync)][0]
            sub0, life0 = results[first][(MAJOR_PAIRS[0][0], sync)][0], results[first][(MAJOR_PAIRS[1][0], sync)][0]
            lines.append(f"| {r['version']} | {'on' if sync else 'off'} | {ratios} | {sub:.0f} / {life:.0f} | "
                         f"{sub / sub0:.2f} / {life / life0:.2f} |")
    lines += ["", f"Settings: {clients} clients, {rounds} alternating rounds of {seconds} s per side, "
                  f"pgbench -M prepared, {os.cpu_count()} CPUs; one cluster per major, one after the other."]
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


def load_pending(cluster, n, prefix):
    """Adds n claimable jobs of gpu-a, as fast as PostgreSQL can write them: the rows submit_job
    inserts (pending, version 1, no attempt yet), without its event or NOTIFY."""
    step = 200_000
    done = 0
    while done < n:
        m = min(step, n - done)
        cluster.psql(f"""
            INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, created_at, updated_at, retry_at)
            SELECT intent.job_id('queue-' || (g % 100), '{prefix}-' || g), 'queue-' || (g % 100), '{prefix}-' || g,
                   'gpu-a', '{{"prompt": "a cat in a hat", "size": 512}}', now(), now(), now()
              FROM generate_series({done + 1}, {done + m}) g""")
        done += m


def build_pickup():
    """Builds client/benches/pickup.rs; the command that runs it, or None without cargo."""
    cargo = shutil.which("cargo")
    if not cargo:
        return None
    cmd = [cargo, "bench", "-q", "-p", "pg_intent_client", "--bench", "pickup"]
    out = subprocess.run(cmd + ["--no-run"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"building client/benches/pickup.rs failed:\n{out.stderr}")
    return cmd


def run_pickup(cluster, cmd, jobs, poll_ms):
    """Runs the pickup bench on the cluster's bench database; its figures (PICKUP_JSON)."""
    import json
    env = dict(clean_environ(), PICKUP_DB=f"host={cluster.dir} port={cluster.port} user=postgres dbname=bench",
               PICKUP_JOBS=str(jobs), PICKUP_POLL_MS=str(poll_ms))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"client/benches/pickup.rs failed:\n{out.stdout}\n{out.stderr}")
    line = next(l for l in out.stdout.splitlines() if l.startswith("PICKUP_JSON "))
    return json.loads(line.split(" ", 1)[1])


def workers(args):
    """The worker side, on one cluster: claim + complete throughput by worker count, the cost of
    NOTIFY on submit throughput, claim latency by the number of finished jobs, pickup latency."""
    quick = args.quick
    seconds = args.seconds or (5 if quick else 10)
    rounds = args.rounds or (2 if quick else 3)
    big = 1_000_000 if quick else 5_000_000
    pickup_cmd = build_pickup()
    md = []  # Markdown lines

    def out(line="", markdown=None):
        print(line, flush=True)
        if markdown is not None:
            md.append(markdown)

    cluster = Cluster(SETTINGS)
    try:
        cluster.psql("CREATE DATABASE bench", db="postgres")
        cluster.psql("CREATE EXTENSION pg_intent")
        cluster.psql(None, file=ROOT / "benches" / "sql" / "baselines.sql")
        out(f"pg_intent worker benchmarks: {rounds} alternating rounds of {seconds}s per side, "
            f"pgbench -M prepared, synchronous_commit on unless said, {os.cpu_count()} CPUs")

        # 1. Pickup latency (first, on a small database: it measures the wake-up, not the tables).
        if pickup_cmd is None:
            out("\npickup latency: skipped (no cargo to build client/benches/pickup.rs)")
            pickup = None
        else:
            pickup = run_pickup(cluster, pickup_cmd, 100 if quick else 300, 100)
            out(f"\npickup latency, submit commit → claim ({pickup['jobs']} jobs one at a time; "
                f"client clock; server: attempts.started_at − jobs.created_at), ms:")
            out(f"  {'claimer':<30} {'p50':>7} {'p99':>7} {'max':>7} {'srv p50':>8} {'srv p99':>8}")
            for key, name in (("notify", "LISTEN + claim on NOTIFY"), ("poll", f"polling every {pickup['poll_ms']} ms")):
                f = pickup[key]
                out(f"  {name:<30} {f['p50']:7.2f} {f['p99']:7.2f} {f['max']:7.2f} {f['server_p50']:8.2f} "
                    f"{f['server_p99']:8.2f}")

        # 2. Claim + complete throughput by worker count, each run on a queue topped up alike.
        need = [max(20_000, 3000 * seconds)]
        refills = [0]

        def fill_queue():
            have = int(cluster.psql("SELECT count(*) FROM intent.jobs WHERE state = 'pending'"))
            if have < need[0]:
                load_pending(cluster, need[0] - have, f"q{refills[0]}")
                refills[0] += 1
            cluster.psql("VACUUM ANALYZE intent.jobs, intent.attempts")

        def run(script, clients):
            fill_queue()
            tps, lat, failed = pgbench(cluster, script, clients, seconds=seconds)
            if failed:
                sys.exit(f"{script}: {failed} failed transactions")
            need[0] = max(need[0], int(2 * tps * seconds))
            return tps, lat

        counts = [1, 4, 16]
        res = {c: ([], []) for c in counts}
        for r in range(rounds):
            for c in (counts if r % 2 == 0 else counts[::-1]):
                tps, lat = run("claim_complete.sql", c)
                res[c][0].append(tps)
                res[c][1].extend(lat)
        out("\nclaim + complete throughput (claim_attempts of 1 job, commit, complete_attempt, commit):",
            "| workers | jobs/s | p50 / p99 ms | ÷ 1 worker |\n|---:|---:|---:|---:|")
        out(f"  {'workers':>7} {'jobs/s':>8} {'p50/p99 ms':>16} {'÷ 1 worker':>11}")
        one = sum(res[1][0])
        for c in counts:
            t = sum(res[c][0])
            out(f"  {c:>7} {t / rounds:>8.0f} {pct(res[c][1], 50):>7.2f}/{pct(res[c][1], 99):<8.2f} {t / one:>11.2f}",
                f"| {c} | {t / rounds:.0f} | {pct(res[c][1], 50):.2f} / {pct(res[c][1], 99):.2f} | {t / one:.2f} |")

        pair = {"claim_complete.sql": ([], []), "claim_complete_by_hand.sql": ([], [])}
        order = list(pair)
        for r in range(rounds):
            for script in (order if r % 2 == 0 else order[::-1]):
                tps, lat = run(script, 4)
                pair[script][0].append(tps)
                pair[script][1].extend(lat)
        o, h = (sum(pair[s][0]) for s in order)
        (ol, hl) = (pair[s][1] for s in order)
        text = (f"claim_attempts ÷ a hand-written SELECT … FOR NO KEY UPDATE SKIP LOCKED LIMIT 1 + begin_attempt, "
                f"then complete, 4 workers: {o / rounds:.0f} ÷ {h / rounds:.0f} jobs/s = {o / h:.2f} "
                f"(p50/p99 {pct(ol, 50):.2f}/{pct(ol, 99):.2f} ms vs {pct(hl, 50):.2f}/{pct(hl, 99):.2f} ms)")
        out("  " + text, "\n- " + text.replace(f"= {o / h:.2f}", f"= **{o / h:.2f}**") + ".")

        # 3. The cost of NOTIFY on submit throughput at 8 clients, with one idle worker listening
        # (as in a deployment: a listener makes every notifying commit signal its backend).
        check = subprocess.run([str(cluster.bin / "psql"), "-X", "-At", "-d", "bench", "-c", "SHOW intent.notify"],
                               env=dict(cluster.env, PGOPTIONS="-c intent.notify=off"), capture_output=True, text=True)
        if check.stdout.strip() != "off":
            sys.exit(f"PGOPTIONS -c intent.notify=off did not take: {check.stdout} {check.stderr}")
        listener = subprocess.Popen([str(cluster.bin / "psql"), "-X", "-q", "-d", "bench"], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cluster.env, text=True)
        listener.stdin.write("LISTEN intent_claimable;\nSELECT 1 \\watch 0.05\n")
        listener.stdin.flush()
        time.sleep(1)
        if listener.poll() is not None:
            sys.exit("the listening psql ended")
        notify = {}
        try:
            out("\nsubmit throughput at 8 clients (submit_new.sql), intent.notify on ÷ off, one idle listener:",
                "\n| synchronous_commit | notify on: submits/s | notify off: submits/s | on p50 / p99 ms | off p50 / p99 ms | on ÷ off |\n|---|---:|---:|---:|---:|---:|")
            for sync in (True, False):
                r_ = {"on": ([], []), "off": ([], [])}
                for r in range(rounds):
                    for side in (("on", "off") if r % 2 == 0 else ("off", "on")):
                        tps, lat, failed = pgbench(cluster, "submit_new.sql", 8, seconds=seconds, sync=sync,
                                                   options=f"-c intent.notify={side}")
                        if failed:
                            sys.exit(f"submit_new.sql: {failed} failed transactions")
                        r_[side][0].append(tps)
                        r_[side][1].extend(lat)
                on, off = sum(r_["on"][0]), sum(r_["off"][0])
                notify["on" if sync else "off"] = on / off
                s_ = "on" if sync else "off"
                out(f"  synchronous_commit {s_:<3}: on {on / rounds:7.0f}/s  off {off / rounds:7.0f}/s  "
                    f"p50/p99 on {pct(r_['on'][1], 50):.2f}/{pct(r_['on'][1], 99):.2f} ms, "
                    f"off {pct(r_['off'][1], 50):.2f}/{pct(r_['off'][1], 99):.2f} ms  on ÷ off {on / off:.3f}",
                    f"| {s_} | {on / rounds:.0f} | {off / rounds:.0f} | {pct(r_['on'][1], 50):.2f} / "
                    f"{pct(r_['on'][1], 99):.2f} | {pct(r_['off'][1], 50):.2f} / {pct(r_['off'][1], 99):.2f} | "
                    f"{on / off:.3f} |")
            # The same cost without pg_intent: a raw INSERT with and without a pg_notify of its own.
            base = compare(cluster, "raw_insert_notify.sql", "raw_insert_new.sql", 8, seconds, rounds, True)
            bn, bo = sum(base["raw_insert_notify.sql"][0]), sum(base["raw_insert_new.sql"][0])
            text = (f"for context, a raw INSERT … ON CONFLICT with pg_notify in its transaction ÷ without, "
                    f"synchronous_commit on: {bn / rounds:.0f} ÷ {bo / rounds:.0f}/s = {bn / bo:.3f}")
            out("  " + text, "\n- " + text.replace("for context, a", "For context, a") + ".")
        finally:
            listener.terminate()
            listener.wait()

        # 4. Claim latency with few finished jobs and with `big`: small, big, small again (the
        # small side is the mean of both, so a steady drift of the machine cancels out).
        per_client, clients = (1500, 4) if quick else (3000, 4)

        def claim_latency(label):
            load_pending(cluster, clients * per_client + 5000, f"lat-{label}")
            cluster.psql("VACUUM ANALYZE intent.jobs, intent.attempts")
            _, lat, failed = pgbench(cluster, "claim_only.sql", clients, transactions=per_client)
            if failed:
                sys.exit(f"claim_only.sql: {failed} failed transactions")
            cluster.psql("DELETE FROM intent.jobs WHERE owner_id LIKE 'queue-%'")
            return lat

        def reset_small():
            cluster.psql("TRUNCATE intent.jobs CASCADE; TRUNCATE intent.events")
            load_jobs(cluster, 10_000, "small")

        reset_small()
        small1 = claim_latency("small1")
        t0 = time.time()
        load_jobs(cluster, big - 10_000, "big")
        load_s = time.time() - t0
        lat_big = claim_latency("big")
        reset_small()
        small2 = claim_latency("small2")
        small = small1 + small2
        r50, r99 = pct(lat_big, 50) / pct(small, 50), pct(lat_big, 99) / pct(small, 99)
        ok = "OK" if r99 <= 1.3 else "MISSED"
        out(f"\nclaim latency (claim_attempts of 1 job, {clients} claimers, a queue of "
            f"{clients * per_client + 5000:,} pending jobs; {big:,} finished jobs loaded in {load_s:.0f}s):")
        text = (f"{big:,} finished jobs: p50/p99 {pct(lat_big, 50):.2f}/{pct(lat_big, 99):.2f} ms; 10,000: "
                f"{pct(small, 50):.2f}/{pct(small, 99):.2f} ms (two runs, before and after: "
                f"{pct(small1, 99):.2f} and {pct(small2, 99):.2f} ms p99); ratio p50 {r50:.2f}, p99 {r99:.2f} "
                f"(target <= 1.30) {ok}")
        out("  " + text, f"- Claim latency with {big:,} finished jobs: p50 / p99 {pct(lat_big, 50):.2f} / "
            f"{pct(lat_big, 99):.2f} ms; with 10,000: {pct(small, 50):.2f} / {pct(small, 99):.2f} ms; ratio p50 "
            f"{r50:.2f}, p99 **{r99:.2f}** (target ≤ 1.30).")
        if pickup is not None:
            md.append(f"- Pickup latency, submit commit → claim, {pickup['jobs']} jobs one at a time: "
                      f"LISTEN + claim on NOTIFY p50 / p99 **{pickup['notify']['p50']:.2f} / "
                      f"{pickup['notify']['p99']:.2f} ms**; polling every {pickup['poll_ms']} ms "
                      f"{pickup['poll']['p50']:.1f} / {pickup['poll']['p99']:.1f} ms (server timestamps: "
                      f"{pickup['notify']['server_p50']:.2f} / {pickup['notify']['server_p99']:.2f} and "
                      f"{pickup['poll']['server_p50']:.1f} / {pickup['poll']['server_p99']:.1f} ms).")
        md.append("")
        md.append(f"Settings: {rounds} alternating rounds of {seconds} s per side, pgbench -M prepared, "
                  f"synchronous_commit on unless said, {os.cpu_count()} CPUs.")
        if args.markdown:
            args.markdown.write_text("\n".join(md) + "\n")
    finally:
        cluster.stop()


def bound_claim(args):
    """A claim by a session bound to one owner, whose own queue is empty, with 400,000 pending
    jobs of other owners ÷ with none (alternating rounds, pooled); then submit
    throughput with the per-owner claim index ÷ without it (the index dropped and created again
    between the sides, alternating)."""
    quick = args.quick
    seconds = args.seconds or (5 if quick else 10)
    rounds = args.rounds or (2 if quick else 4)
    others = 400_000
    clients, per_client = (4, 500) if quick else (4, 2000)
    bound = "-c intent.owner_id=tenant-x"
    md = []

    def out(line="", markdown=None):
        print(line, flush=True)
        if markdown is not None:
            md.append(markdown)

    cluster = Cluster(SETTINGS)
    try:
        cluster.psql("CREATE DATABASE bench", db="postgres")
        cluster.psql("CREATE EXTENSION pg_intent")
        # The sessions are bound: a submit for another owner is refused (42501).
        check = subprocess.run([str(cluster.bin / "psql"), "-X", "-At", "-d", "bench", "-c", "\\set VERBOSITY verbose",
                                "-c", "SELECT intent.submit_job('someone-else', 'k', 'gpu-a', '{}')"],
                               env=dict(cluster.env, PGOPTIONS=bound), capture_output=True, text=True)
        if "42501" not in check.stderr:
            sys.exit(f"PGOPTIONS {bound} did not bind the session: {check.stdout} {check.stderr}")
        out(f"pg_intent bound claim benchmark: {clients} bound claimers × {per_client} claims each "
            f"(claim_attempts of 1 job, its owner's queue empty), pgbench -M prepared, {os.cpu_count()} CPUs")

        def latency():
            # Vacuumed, analyzed and checkpointed: the load's dirty pages are not being written
            # out while one side runs.
            cluster.psql("VACUUM ANALYZE intent.jobs, intent.attempts")
            cluster.psql("CHECKPOINT")
            _, lat, failed = pgbench(cluster, "claim_bound_empty.sql", clients, transactions=per_client,
                                     options=bound)
            if failed:
                sys.exit(f"claim_bound_empty.sql: {failed} failed transactions")
            return lat

        # Alternating rounds (none, 400k; none, 400k; …), each side pooled over the rounds, so
        # that a drift of the machine hits both alike.
        small, big, load_s = [], [], 0.0
        for r in range(rounds):
            small += latency()
            t0 = time.time()
            load_pending(cluster, others, f"others{r}")
            load_s += time.time() - t0
            big += latency()
            cluster.psql("DELETE FROM intent.jobs WHERE owner_id LIKE 'queue-%'")
        mean = lambda v: sum(v) / len(v)
        r50, r99, rmean = (pct(big, 50) / pct(small, 50), pct(big, 99) / pct(small, 99), mean(big) / mean(small))
        ok = "OK" if r50 <= 1.5 and rmean <= 1.5 else "MISSED"
        text = (f"bound claim, empty own queue, {others:,} other-owner pending jobs ÷ none ({rounds} alternating "
                f"rounds): p50 {pct(big, 50):.3f} ÷ {pct(small, 50):.3f} ms = {r50:.2f}, p99 {pct(big, 99):.3f} ÷ "
                f"{pct(small, 99):.3f} ms = {r99:.2f}, mean {mean(big):.3f} ÷ {mean(small):.3f} ms = {rmean:.2f} "
                f"(target <= 1.5) {ok}; {others:,} jobs loaded in {load_s / rounds:.0f}s")
        out("  " + text, f"- Bound claim (its owner's queue empty) with {others:,} pending jobs of other owners ÷ "
            f"with none, {rounds} alternating rounds: p50 {pct(big, 50):.3f} ÷ {pct(small, 50):.3f} ms = **{r50:.2f}**, "
            f"p99 {pct(big, 99):.3f} ÷ {pct(small, 99):.3f} ms = {r99:.2f}, mean {mean(big):.3f} ÷ {mean(small):.3f} ms "
            f"= **{rmean:.2f}** (target ≤ 1.5).")

        # Submit throughput with the per-owner index ÷ without it.
        cluster.psql("TRUNCATE intent.jobs CASCADE; TRUNCATE intent.events")
        create = cluster.psql("SELECT pg_get_indexdef('intent.jobs_claimable_by_owner'::regclass)")
        res = {"with": ([], []), "without": ([], [])}
        for r in range(rounds):
            for side in (("with", "without") if r % 2 == 0 else ("without", "with")):
                present = cluster.psql("SELECT to_regclass('intent.jobs_claimable_by_owner') IS NOT NULL") == "t"
                if side == "without" and present:
                    cluster.psql("DROP INDEX intent.jobs_claimable_by_owner")
                if side == "with" and not present:
                    cluster.psql(create)
                cluster.psql("VACUUM ANALYZE intent.jobs")
                tps, lat, failed = pgbench(cluster, "submit_new.sql", clients, seconds=seconds)
                if failed:
                    sys.exit(f"submit_new.sql: {failed} failed transactions")
                res[side][0].append(tps)
                res[side][1].extend(lat)
        w, wo = sum(res["with"][0]), sum(res["without"][0])
        text = (f"submit throughput (submit_new.sql, {clients} clients, {rounds} alternating rounds of {seconds}s), "
                f"with jobs_claimable_by_owner ÷ without: {w / rounds:.0f} ÷ {wo / rounds:.0f}/s = {w / wo:.3f} "
                f"(p50/p99 {pct(res['with'][1], 50):.2f}/{pct(res['with'][1], 99):.2f} ms vs "
                f"{pct(res['without'][1], 50):.2f}/{pct(res['without'][1], 99):.2f} ms)")
        out("  " + text, "- " + text[0].upper() + text[1:].replace(f"= {w / wo:.3f}", f"= **{w / wo:.3f}**") + ".")
        md.append("")
        md.append(f"{os.cpu_count()} CPUs, synchronous_commit on, pgbench -M prepared.")
        if args.markdown:
            args.markdown.write_text("\n".join(md) + "\n")
    finally:
        cluster.stop()


def claim_buffers(cluster, setup=""):
    """The shared buffers one claim of 20 touches (hit + read): EXPLAIN (ANALYZE, BUFFERS) of a
    query that calls it counts what the function's own statements read too."""
    claim = "SELECT count(*) FROM intent.claim_attempts(ARRAY['gpu-a'], 'bench', '30 seconds', 20)"
    # The first claims of the session plan the library's statements (catalog reads) and, as a
    # worker's claims do, commit: the third, rolled back, is the one counted.
    # Each -c its own transaction (one -c with several statements would be one transaction).
    cmd = [str(cluster.bin / "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", "bench"]
    for sql in (f"{setup}{claim}", f"{setup}{claim}",
                f"{setup}BEGIN; EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim}; ROLLBACK"):
        cmd += ["-c", sql]
    plan = subprocess.run(cmd, env=cluster.env, check=True, capture_output=True, text=True).stdout
    top = json.loads(plan[plan.index("["):])[0]
    p = top["Plan"]
    return p.get("Shared Hit Blocks", 0) + p.get("Shared Read Blocks", 0)


def held_snapshot(args):
    """Claims of 20, each committed as a worker's are, by one session, behind 100,000 jobs
    claimed since another session took its snapshot ÷ the same claims on the same table after
    the holder ended and VACUUM removed what it kept; and, on the held table, the same claims
    with intent.claim_rescan = 0 (every claim reads the whole queue, as before 0.5.0) ÷ vacuumed.
    The holder is a REPEATABLE READ transaction that has read something and stays open: what
    pg_dump, a long report or an idle client in a transaction do. Printed: latency p50/p99/mean
    and the shared buffers one claim touches."""
    quick = args.quick
    rounds = args.rounds or (2 if quick else 3)
    claimed = 20_000 if quick else 100_000
    per_side = 300 if quick else 1000
    waiting = 2 * (per_side * 20 + 100) + 1_000
    whole = "-c intent.claim_rescan=0"
    md = []

    def out(line="", markdown=None):
        print(line, flush=True)
        if markdown is not None:
            md.append(markdown)

    cluster = Cluster(SETTINGS)
    holder = None
    try:
        cluster.psql("CREATE DATABASE bench", db="postgres")
        cluster.psql("CREATE EXTENSION pg_intent")
        out(f"pg_intent held-snapshot claim benchmark: claims of 20 (committed, one session) from {waiting:,} "
            f"claimable jobs, behind {claimed:,} jobs claimed under a held snapshot ÷ vacuumed, {per_side} claims a "
            f"side, {rounds} rounds, pgbench -M prepared, {os.cpu_count()} CPUs")

        def measure(options=""):
            _, lat, failed = pgbench(cluster, "claim_20.sql", 1, transactions=per_side, options=options)
            if failed:
                sys.exit(f"claim_20.sql: {failed} failed transactions")
            setup = "SET intent.claim_rescan = 0; " if options else ""
            return lat, claim_buffers(cluster, setup)

        def claim_all(n):
            # Claims n jobs in batches (begins their attempts: they leave the claimable index).
            left = n
            while left > 0:
                got = int(cluster.psql(f"SELECT count(*) FROM intent.claim_attempts(ARRAY['gpu-a'], 'loader', "
                                       f"'1 hour', {min(left, 1000)})"))
                if got == 0:
                    sys.exit("claim_all: nothing left to claim")
                left -= got

        sides = {k: ([], []) for k in ("clean", "held", "held_whole")}

        def keep(side, measured):
            sides[side][0].extend(measured[0])
            sides[side][1].append(measured[1])

        for r in range(rounds):
            cluster.psql("TRUNCATE intent.jobs CASCADE; TRUNCATE intent.events")
            # The clean side: the claimed jobs' old versions vacuumed away.
            load_pending(cluster, claimed, f"c{r}")
            claim_all(claimed)
            load_pending(cluster, waiting, f"w{r}")
            cluster.psql("VACUUM ANALYZE intent.jobs, intent.attempts")
            keep("clean", measure())
            # The held side: the same, with a snapshot held from before the claims; then the same
            # claims reading the whole queue each time (behind 20,000 more claimed jobs).
            cluster.psql("TRUNCATE intent.jobs CASCADE; TRUNCATE intent.events")
            cluster.psql("VACUUM ANALYZE intent.jobs, intent.attempts")
            holder = subprocess.Popen([str(cluster.bin / "psql"), "-X", "-q", "-d", "bench"], stdin=subprocess.PIPE,
                                      env=cluster.env, text=True, stdout=subprocess.DEVNULL)
            holder.stdin.write("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM intent.jobs;\n")
            holder.stdin.flush()
            time.sleep(1)
            load_pending(cluster, claimed, f"h{r}")
            claim_all(claimed)
            load_pending(cluster, waiting, f"v{r}")
            cluster.psql("VACUUM ANALYZE intent.jobs, intent.attempts")
            keep("held", measure())
            keep("held_whole", measure(whole))
            holder.stdin.write("ROLLBACK;\n\\q\n")
            holder.stdin.close()
            holder.wait(timeout=60)
            holder = None
        mean = lambda v: sum(v) / len(v)
        clean, clean_buf = sides["clean"]
        for side, label in (("held", "from where the last claim started (0.5.0)"),
                            ("held_whole", "reading the whole queue (claim_rescan = 0, as before 0.5.0)")):
            lat, buf = sides[side]
            r50, r99, rmean = pct(lat, 50) / pct(clean, 50), pct(lat, 99) / pct(clean, 99), mean(lat) / mean(clean)
            verdict = (" (target <= 1.5) " + ("OK" if rmean <= 1.5 else "MISSED")) if side == "held" else ""
            text = (f"claims of 20 {label}, behind {claimed:,} jobs claimed under a held snapshot ÷ vacuumed "
                    f"({rounds} rounds): p50 {pct(lat, 50):.3f} ÷ {pct(clean, 50):.3f} ms = {r50:.2f}, p99 "
                    f"{pct(lat, 99):.3f} ÷ {pct(clean, 99):.3f} ms = {r99:.2f}, mean {mean(lat):.3f} ÷ "
                    f"{mean(clean):.3f} ms = {rmean:.2f}{verdict}; buffers per claim {mean(buf):.0f} ÷ "
                    f"{mean(clean_buf):.0f}")
            out("  " + text, "- " + text[0].upper() + text[1:] + ".")
        md.append("")
        md.append(f"{os.cpu_count()} CPUs, synchronous_commit on, pgbench -M prepared.")
        if args.markdown:
            args.markdown.write_text("\n".join(md) + "\n")
    finally:
        if holder is not None:
            holder.kill()
        cluster.stop()


def hot(args):
    """Row versions per job and the share of HOT updates per table, read from
    pg_stat_user_tables after N lifecycles by one client (the statistics reset before each),
    for a direct lifecycle and for a worker's; and WAL per lifecycle ÷ the bare statements."""
    n = 2_000 if args.quick else 10_000
    cluster = Cluster(SETTINGS)
    try:
        cluster.psql("CREATE DATABASE bench", db="postgres")
        cluster.psql("CREATE EXTENSION pg_intent")
        cluster.psql(None, file=ROOT / "benches" / "sql" / "baselines.sql")
        print(f"pg_intent row versions and HOT updates per lifecycle: {n:,} lifecycles by one client, "
              f"{os.cpu_count()} CPUs", flush=True)

        def tables():
            time.sleep(1.5)  # the backends report their counts when they end
            rows = cluster.psql("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
                                "FROM pg_stat_user_tables WHERE schemaname = 'intent' "
                                "AND relname IN ('jobs', 'attempts', 'events') ORDER BY relname")
            return [r.split("|") for r in rows.splitlines()]

        def report(label):
            print(f"  {label}:")
            for name, ins, upd, hot_upd, dele in tables():
                ins, upd, hot_upd, dele = int(ins), int(upd), int(hot_upd), int(dele)
                share = f"{100 * hot_upd / upd:.0f} %" if upd else "-"
                print(f"    {name:<9} per job: {ins / n:.2f} inserts, {upd / n:.2f} updates ({hot_upd / n:.2f} HOT, "
                      f"{share}), {dele / n:.2f} deletes; row versions {(ins + upd) / n:.2f}", flush=True)

        cluster.psql("SELECT pg_stat_reset()")
        pgbench(cluster, "lifecycle.sql", 1, transactions=n)
        report("direct lifecycle (submit_job, begin_attempt, complete_attempt)")
        load_pending(cluster, n, "hot")
        time.sleep(1.5)
        cluster.psql("SELECT pg_stat_reset()")
        pgbench(cluster, "claim_complete.sql", 1, transactions=n)
        report(f"worker lifecycle (claim_attempts, complete_attempt; the {n:,} jobs loaded before, not counted)")
        ours, bare, ours_fpi, bare_fpi = wal_per_lifecycle(cluster, n)
        images = "" if ours_fpi is None else f"; full-page images in them {ours_fpi:.0f} and {bare_fpi:.0f} bytes"
        print(f"  WAL per lifecycle: {ours:.0f} ÷ {bare:.0f} bytes (bare statements) = {ours / bare:.2f} "
              f"(target <= 1.15){images}", flush=True)
    finally:
        cluster.stop()


def print_header():
    print(f"\n{'comparison':<46} {'sync':>4} {'ours tps':>9} {'base tps':>9} {'ours p50/p99 ms':>16} "
          f"{'base p50/p99 ms':>16} {'ratio':>6} {'target':>7}")


def print_row(r):
    target = f">={r['target']:.2f}" if r["target"] is not None else ""
    mark = "" if r["ok"] is None else (" OK" if r["ok"] else " MISSED")
    print(f"{r['what']:<46} {r['sync']:>4} {r['ours_tps']:>9.0f} {r['base_tps']:>9.0f} "
          f"{r['ours_p50']:>7.2f}/{r['ours_p99']:<8.2f} {r['base_p50']:>7.2f}/{r['base_p99']:<8.2f} "
          f"{r['ratio']:>6.2f} {target:>7}{mark}", flush=True)


def write_markdown(args, rows, ours_wal, bare_wal, wal_ratio, batch, big, lat_small, lat_big, p99_ratio,
                   hammer_calls, hammer_failed, hammer_jobs, clients, seconds, rounds):
    lines = [
        "| comparison | synchronous_commit | pg_intent tps | baseline tps | pg_intent p50 / p99 ms | baseline p50 / p99 ms | ratio | target |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        target = f"≥ {r['target']:.2f}" if r["target"] is not None else "—"
        mark = "" if r["ok"] is None else (" ✔" if r["ok"] else " ✘")
        lines.append(f"| {r['what'].strip()} | {r['sync']} | {r['ours_tps']:.0f} | {r['base_tps']:.0f} | "
                     f"{r['ours_p50']:.2f} / {r['ours_p99']:.2f} | {r['base_p50']:.2f} / {r['base_p99']:.2f} | "
                     f"{r['ratio']:.2f} | {target}{mark} |")
    lines += [
        "",
        f"- WAL per lifecycle: pg_intent {ours_wal:.0f} B, bare statements {bare_wal:.0f} B, ratio **{wal_ratio:.2f}** (target ≤ 1.15; benches/run.py wal_per_lifecycle).",
    ]
    for sync, (b, single, ratio) in batch.items():
        lines.append(f"- Batch submit, 100 intents per call ÷ 100 single calls (synchronous_commit {sync}): "
                     f"{b:.0f} ÷ {single:.0f} jobs/s = **{ratio:.1f}×** (target ≥ 10×).")
    lines += [
        f"- Submit p99 latency with {big:,} existing jobs: {pct(lat_big, 99):.2f} ms; with 10,000: "
        f"{pct(lat_small, 99):.2f} ms; ratio **{p99_ratio:.2f}** (target ≤ 1.50).",
        f"- 32 clients hammering one key: {hammer_calls} calls, {hammer_failed} errors, {hammer_jobs} job.",
        "",
        f"Settings: {clients} clients, {rounds} alternating rounds of {seconds} s per side, pgbench -M prepared, "
        f"{os.cpu_count()} CPUs.",
    ]
    args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

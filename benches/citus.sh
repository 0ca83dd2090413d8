#!/usr/bin/env bash
# Throughput of pg_intent's distributed mode (docs/scale-out.md) against a single node, both
# measured in the same run on this machine: a plain server with default settings, and a
# loopback Citus cluster of one coordinator and two workers with `intent.distribute()` run on
# it. The same binaries serve both. Each workload and client count runs on the single node and
# then on the cluster, back to back; the table gives both and the ratio cluster ÷ single. On one
# machine the cluster does three servers' work on the CPUs of one: read the ratio as the
# overhead of distribution, not as what more machines give (docs/scale-out.md § Measured).
#
# Usage: PG_INTENT_CITUS_BIN=/path/to/pg15/bin bash benches/citus.sh
#   PG_INTENT_CITUS_BIN  a PostgreSQL bin directory whose lib directory (pg_config --pkglibdir)
#                        has citus.so and pg_intent installed; unset: says it skipped, exits 0
#   CITUS_BENCH_SECONDS  seconds per pgbench run (default 15)
#   CITUS_BENCH_CLIENTS  client counts (default "4 8")
# Fails (non-zero) if a pgbench run fails or reports failed transactions. Every server and
# temporary directory it made is removed on exit, also on error or interrupt.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

if [ -z "${PG_INTENT_CITUS_BIN:-}" ]; then
  echo "skipped: no Citus (set PG_INTENT_CITUS_BIN=<bin directory of a PostgreSQL whose lib directory has citus.so and pg_intent>)"
  exit 0
fi
BIN="$PG_INTENT_CITUS_BIN"
SECS="${CITUS_BENCH_SECONDS:-15}"
CLIENTS="${CITUS_BENCH_CLIENTS:-4 8}"
[[ "$SECS" =~ ^[1-9][0-9]*$ ]] || die "CITUS_BENCH_SECONDS=$SECS: not a positive number of seconds"
for c in $CLIENTS; do [[ "$c" =~ ^[1-9][0-9]*$ ]] || die "CITUS_BENCH_CLIENTS: '$c' is not a client count"; done
for b in initdb pg_ctl psql pgbench pg_config postgres; do
  [ -x "$BIN/$b" ] || die "PG_INTENT_CITUS_BIN=$BIN: no $b there"
done
LIBDIR="$("$BIN/pg_config" --pkglibdir)"
[ -f "$LIBDIR/citus.so" ] || die "PG_INTENT_CITUS_BIN=$BIN: $LIBDIR/citus.so does not exist"
[ -f "$LIBDIR/pg_intent.so" ] || die "PG_INTENT_CITUS_BIN=$BIN: $LIBDIR/pg_intent.so does not exist"
# Nothing inherited may send a connection elsewhere: every command below names its server.
unset_libpq_env
unset PGHOST PGPORT PGUSER PGDATABASE

WORK="$(mktemp -d /tmp/pg_intent_citus_bench.XXXXXX)"
chmod 755 "$WORK"
if [ "$(id -u)" = 0 ]; then chown postgres: "$WORK"; fi
STARTED=() # data directories of the servers started, for cleanup
cleanup() {
  local d
  for d in "${STARTED[@]}"; do
    run_pg "$BIN/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

declare -A PORT
# start_node NAME [SETTING=VALUE ...]: initdb (trust auth, on the socket and on loopback) and a
# server on a free port, its socket and data in $WORK/NAME. Another process may take the port
# between free_port and the bind: a few tries.
start_node() {
  local name="$1" dir="$WORK/$1" opts="" s try port
  shift
  for s in "$@"; do opts+=" -c $s"; done
  run_pg mkdir -p "$dir"
  run_pg "$BIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync \
    >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; die "$name: initdb failed"; }
  STARTED+=("$dir/data")
  for try in 1 2 3; do
    port="$(free_port)"
    if run_pg "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 120 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1$opts" start >/dev/null 2>&1; then
      PORT[$name]="$port"
      return
    fi
    [ "$try" = 3 ] || log "$name: did not start on port $port, trying another"
  done
  cat "$dir/server.log" >&2
  die "$name: the server did not start"
}

q() { # q NAME SQL: one statement on NAME's bench database, its result unaligned
  "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$WORK/$1" -p "${PORT[$1]}" -U postgres -d bench \
    -c "SET client_min_messages = warning" -c "$2"
}

log "starting a single node and a 1 coordinator + 2 workers Citus cluster in $WORK ($BIN)"
start_node single
CITUS=(shared_preload_libraries=citus max_prepared_transactions=100 max_connections=200)
for n in coordinator worker1 worker2; do start_node "$n" "${CITUS[@]}"; done

for n in single coordinator worker1 worker2; do
  "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK/$n" -p "${PORT[$n]}" -U postgres -d postgres \
    -c "CREATE DATABASE bench" >/dev/null
done
for n in coordinator worker1 worker2; do q "$n" "CREATE EXTENSION citus" >/dev/null; done
q coordinator "SELECT citus_set_coordinator_host('127.0.0.1', ${PORT[coordinator]})" >/dev/null
for n in worker1 worker2; do q coordinator "SELECT citus_add_node('127.0.0.1', ${PORT[$n]})" >/dev/null; done
q coordinator "CREATE EXTENSION pg_intent" >/dev/null
log "intent.distribute(): $(q coordinator "SELECT intent.distribute()" | tr '\n' ' ')"
q single "CREATE EXTENSION pg_intent" >/dev/null
[ "$(q coordinator "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'intent.jobs'::regclass")" = 1 ] \
  || die "intent.jobs is not distributed on the coordinator"

# The two workloads of docs/scale-out.md § Measured, exactly as shown there.
cat >"$WORK/submit.sql" <<'EOF'
\set k random(1, 2000000000)
SELECT job_id FROM intent.submit_job('bench', 's' || :k, 'gpu', '{"prompt": "a cat", "n": 1}');
EOF
cat >"$WORK/lifecycle.sql" <<'EOF'
\set k random(1, 2000000000)
SELECT job_id FROM intent.submit_job('bench', 'l' || :k, 'gpu', '{"prompt": "a cat", "n": 1}') \gset
SELECT attempt_id, version FROM intent.begin_attempt(:job_id) \gset
SELECT intent.complete_attempt(:attempt_id, :version, '{"ok": true}');
EOF
chmod 644 "$WORK"/*.sql

# bench NAME SCRIPT CLIENTS -> "tps latency_ms": one pgbench run; fails on a pgbench error or on
# any failed transaction.
bench() {
  local out="$WORK/pgbench.$1.$2.$3.out" tps lat failed
  if ! "$BIN/pgbench" -n -M prepared -j 2 -c "$3" -T "$SECS" -f "$WORK/$2.sql" \
    -h "$WORK/$1" -p "${PORT[$1]}" -U postgres bench >"$out" 2>&1; then
    cat "$out" >&2
    die "pgbench $2.sql with $3 clients on $1 failed"
  fi
  if grep -q 'ERROR\|aborted' "$out"; then cat "$out" >&2; die "pgbench $2.sql with $3 clients on $1: errors"; fi
  failed="$(awk -F': *' '/^number of failed transactions/ { split($2, a, " "); print a[1] }' "$out")"
  [ "${failed:-0}" = 0 ] || { cat "$out" >&2; die "pgbench $2.sql with $3 clients on $1: $failed failed transactions"; }
  tps="$(awk '/^tps = / { print $3; exit }' "$out")"
  lat="$(awk '/^latency average = / { print $4; exit }' "$out")"
  if [ -z "$tps" ] || [ -z "$lat" ]; then cat "$out" >&2; die "pgbench $2.sql on $1: no tps or latency in its output"; fi
  echo "$tps $lat"
}

START="$(date -u '+%Y-%m-%d %H:%M')"
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
ROWS=()
for w in submit lifecycle; do
  for c in $CLIENTS; do
    log "$w, $c clients: single node, then cluster (${SECS} s each)"
    s="$(bench single "$w" "$c")"
    k="$(bench coordinator "$w" "$c")"
    ROWS+=("$w $c $s $k")
  done
done
END="$(date -u '+%H:%M')"
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

PGV="$("$BIN/postgres" --version | awk '{ print $NF }')"
CITUSV="$(q coordinator "SELECT (regexp_match(citus_version(), '^Citus ([^ ]+)'))[1]")"
INTENTV="$(q coordinator "SELECT extversion FROM pg_extension WHERE extname = 'pg_intent'")"
SHARDS="$(q coordinator "SHOW citus.shard_count")"
JOBS="$(q coordinator "SELECT count(*) FROM intent.jobs")"
PER_WORKER="$(q coordinator "SELECT string_agg(n::text, ', ' ORDER BY port) FROM (
  SELECT nodeport AS port, count(*) AS n FROM pg_dist_shard_placement p JOIN pg_dist_shard s USING (shardid)
  WHERE s.logicalrelid = 'intent.jobs'::regclass GROUP BY nodeport) x")"

echo
echo "$START–$END UTC, $(nproc) CPUs, load average (1, 5, 15 min) $LOAD_BEFORE before, $LOAD_AFTER after."
echo "PostgreSQL $PGV, Citus $CITUSV ($SHARDS shards per table), pg_intent $INTENTV, pgbench -M prepared -j 2, $SECS s per run."
echo
echo "| workload | clients | single node | 1 coordinator + 2 workers | ratio |"
echo "|---|---|---|---|---|"
for r in "${ROWS[@]}"; do
  # shellcheck disable=SC2086 # the row's fields, split on purpose
  set -- $r
  awk -v w="$1" -v c="$2" -v st="$3" -v sl="$4" -v ct="$5" -v cl="$6" 'BEGIN {
    label = (w == "submit") ? "submit (tps)" : "lifecycle (lifecycles/s)"
    printf "| %s | %s | %.0f (%.1f ms) | %.0f (%.1f ms) | %.2f |\n", label, c, st, sl, ct, cl, ct / st }'
done
echo
echo "No failed transactions in any run; the cluster held $JOBS jobs afterwards, intent.jobs shards per worker: $PER_WORKER."

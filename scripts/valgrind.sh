#!/usr/bin/env bash
# The memory-checking pass: a PostgreSQL server running under valgrind memcheck (every backend
# and worker it forks), with pg_intent installed, runs
#   1. the pg_regress suite,
#   2. the isolation suite,
#   3. the large-value corpus (tests/valgrind/large_values.sql).
# Any invalid read or write, or use of uninitialised memory, in any process of the server fails
# the run, with the report printed. PostgreSQL's own known reports (uninitialised padding bytes
# written to the WAL, to the statistics file and sent in messages) are suppressed by
# tests/valgrind/postgres.supp; nothing else is.
#
# Debian's server is not built with valgrind's client requests, so memcheck sees malloc's
# blocks, not palloc's chunks: a read of freed memory is caught when the freed memory was a
# block of its own (values over 8 kB, which is what the large-value corpus is made of).
#
# Usage: bash scripts/valgrind.sh          (the test command runs it; it takes a few minutes)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

command -v valgrind >/dev/null || install_packages

VG_DIR="$(mktemp -d /tmp/pg_intent_valgrind.XXXXXX)"
chmod 755 "$VG_DIR"
mkdir -p "$VG_DIR/logs"
[ "$(id -u)" = 0 ] && chown -R postgres: "$VG_DIR"
PORT="$(free_port)"
cleanup() {
  run_pg "$PG_BIN/pg_ctl" -D "$VG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
  [ -n "${KEEP_VALGRIND_LOGS:-}" ] || rm -rf "$VG_DIR"
}
trap cleanup EXIT

run_pg "$PG_BIN/initdb" -D "$VG_DIR/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync \
  >"$VG_DIR/initdb.log" 2>&1 || { cat "$VG_DIR/initdb.log"; die "initdb failed"; }

log "starting the server under valgrind memcheck (port $PORT, logs in $VG_DIR/logs)"
# Memcheck is 20-50 times slower: no autovacuum or background noise, and one parallel worker.
run_pg valgrind --quiet --trace-children=yes --error-limit=no --num-callers=40 \
  --suppressions="$ROOT/tests/valgrind/postgres.supp" --gen-suppressions=all \
  --log-file="$VG_DIR/logs/%p.log" \
  "$PG_BIN/postgres" -D "$VG_DIR/data" -p "$PORT" -k "$VG_DIR" -c listen_addresses=127.0.0.1 \
  -c autovacuum=off -c fsync=off -c max_parallel_workers_per_gather=1 \
  -c max_connections=30 -c shared_buffers=32MB >"$VG_DIR/server.log" 2>&1 &
for _ in $(seq 1 240); do
  "$PG_BIN/pg_isready" -q -h "$VG_DIR" -p "$PORT" && break
  sleep 0.5
done
"$PG_BIN/pg_isready" -q -h "$VG_DIR" -p "$PORT" || { cat "$VG_DIR/server.log"; die "the server did not start under valgrind"; }

export PGHOST="$VG_DIR" PGPORT="$PORT" PGUSER=postgres
failed=()
bash "$ROOT/scripts/regress.sh" || failed+=("SQL suites")
log "large-value corpus (tests/valgrind/large_values.sql)"
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE pg_intent_valgrind"
"$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -d pg_intent_valgrind -f "$ROOT/tests/valgrind/large_values.sql" \
  >"$VG_DIR/large_values.out" 2>&1 || { cat "$VG_DIR/large_values.out"; failed+=("large-value corpus"); }
if grep -q ' f$' "$VG_DIR/large_values.out"; then
  cat "$VG_DIR/large_values.out"
  failed+=("large-value corpus: a value came back different")
fi

log "stopping the server, collecting valgrind's reports"
run_pg "$PG_BIN/pg_ctl" -D "$VG_DIR/data" -m fast -w -t 300 stop >/dev/null || true
processes=$(ls "$VG_DIR/logs" | wc -l)
errors=0
for f in "$VG_DIR"/logs/*.log; do
  if grep -qE '^==[0-9]+== (Invalid|Conditional jump|Use of uninitialised|Syscall param|Mismatched|Source and destination)' "$f"; then
    errors=$((errors + 1))
    printf '\n==== valgrind: %s ====\n' "$f" >&2
    cat "$f" >&2
  fi
done
log "valgrind watched $processes processes; $errors reported errors"
[ "$errors" = 0 ] || failed+=("valgrind: $errors processes with errors")
if grep -q "server process .* was terminated by signal" "$VG_DIR/server.log"; then
  grep "terminated by signal" "$VG_DIR/server.log" >&2
  failed+=("a backend crashed")
fi
[ ${#failed[@]} = 0 ] || die "valgrind pass failed: ${failed[*]}"
log "valgrind pass: 0 errors"

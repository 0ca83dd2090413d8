#!/usr/bin/env bash
# Runs the SQL-level suites of pg_intent against an installed extension:
#   1. pg_regress            tests/pg_regress/{sql,expected}, order in tests/pg_regress/schedule
#   2. pg_isolation_regress  tests/isolation/{specs,expected}, order in tests/isolation/schedule
#
# Uses the cluster named by PGHOST/PGPORT (scripts/test.sh starts one and calls this script).
# Without PGHOST it starts a throwaway cluster of its own (scripts/lib.sh) and removes it on exit,
# of the target PG_INTENT_TARGET names (tests/README.md § Targets; scripts/conformance.sh): on
# citus each suite's database is distributed before the suite runs, and isolationtester is
# given Citus's test of whether a session is blocked (it waits on a worker, not on the
# coordinator); the expected files are the same for every target.
# Each suite gets a fresh database (dropped and created here, then used with --use-existing), so
# a run never depends on what an earlier run left behind. Results land in
# tests/pg_regress/results and tests/isolation/results (gitignored). On a failure the diffs are
# printed and the script exits non-zero.
#
# PG_INTENT_REGRESS_SKIP="name …" leaves those tests (of either schedule) out: scripts/conformance.sh
# lists, with the reason, the ones a target cannot run.
#
# Usage: bash scripts/regress.sh [pg_regress|isolation]   (default: both)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

which_suites="${1:-all}"
case "$which_suites" in all | pg_regress | isolation) ;; *) die "usage: $0 [pg_regress|isolation]" ;; esac

PG_REGRESS="$PGXS_TEST/regress/pg_regress"
PG_ISOLATION_REGRESS="$PGXS_TEST/isolation/pg_isolation_regress"
[ -x "$PG_REGRESS" ] || die "pg_regress not found at $PG_REGRESS (install postgresql-server-dev-$PG_MAJOR)"
[ -x "$PG_ISOLATION_REGRESS" ] || die "pg_isolation_regress not found at $PG_ISOLATION_REGRESS"

if [ -z "${PGHOST:-}" ]; then
  start_cluster # sets PGHOST, PGPORT, PGUSER and removes the cluster on exit
elif [ "$(target)" = citus ]; then
  die "PG_INTENT_TARGET=citus: run without PGHOST (this script starts the Citus cluster)"
fi
export PGHOST PGPORT="${PGPORT:-5432}"
export PGUSER=postgres

psql_admin() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }

# A fresh database per suite, with the settings pg_regress gives the databases it creates
# itself (it does not create them under --use-existing).
fresh_db() {
  local db="$1"
  psql_admin -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" \
             -c "CREATE DATABASE \"$db\" TEMPLATE template0 ENCODING 'UTF8'" \
             -c "ALTER DATABASE \"$db\" SET lc_messages TO 'C'" \
             -c "ALTER DATABASE \"$db\" SET lc_monetary TO 'C'" \
             -c "ALTER DATABASE \"$db\" SET lc_numeric TO 'C'" \
             -c "ALTER DATABASE \"$db\" SET lc_time TO 'C'" \
             -c "ALTER DATABASE \"$db\" SET bytea_output TO 'hex'" \
             -c "ALTER DATABASE \"$db\" SET timezone_abbreviations TO 'Default'" || return 1
  prepare_target_db "$db"
}

# isolationtester asks pg_isolation_test_session_is_blocked() whether a step waits; on Citus a
# step waits for a lock on a worker, which only Citus's version of the function sees (Citus's
# own isolation tests swap it in the same way; it calls the original first).
citus_isolation() {
  local db="$1"
  psql_admin -d "$db" \
    -c "ALTER FUNCTION pg_catalog.pg_isolation_test_session_is_blocked(integer, integer[]) RENAME TO old_pg_isolation_test_session_is_blocked" \
    -c "ALTER FUNCTION pg_catalog.citus_isolation_test_session_is_blocked(integer, integer[]) RENAME TO pg_isolation_test_session_is_blocked"
}

# The results directories must be writable by whoever runs pg_regress (root, in CI); the
# server never writes there.
run_suite() { # run_suite NAME TOOL DIR DB
  local name="$1" tool="$2" dir="$3" db="$4"
  log "$name: $dir (database $db on ${PGHOST}:${PGPORT}, target $(target))"
  # (set -e does not apply inside a function called from `||`, hence the explicit returns.)
  fresh_db "$db" || { printf 'error: cannot create database %s\n' "$db" >&2; return 1; }
  if [ "$name" = isolation ] && [ "$(target)" = citus ]; then
    citus_isolation "$db" || return 1
  fi
  rm -rf "$dir/results" "$dir/output_iso" "$dir/regression.diffs" "$dir/regression.out"
  mkdir -p "$dir/results" || return 1
  # The schedule without the tests PG_INTENT_REGRESS_SKIP names.
  local schedule="$dir/results/schedule" t
  cp "$dir/schedule" "$schedule" || return 1
  for t in ${PG_INTENT_REGRESS_SKIP:-}; do
    grep -qx "test: $t" "$schedule" || continue
    sed -i "/^test: $t\$/d" "$schedule"
    log "$name: $t left out (PG_INTENT_REGRESS_SKIP)"
  done
  if "$tool" \
       --use-existing \
       --bindir="$PG_BIN" \
       --host="$PGHOST" --port="$PGPORT" --user=postgres \
       --dbname="$db" \
       --inputdir="$dir" --outputdir="$dir" \
       --schedule="$schedule"; then
    return 0
  fi
  if [ -f "$dir/regression.diffs" ]; then
    printf '\n==== %s/regression.diffs ====\n' "$dir" >&2
    cat "$dir/regression.diffs" >&2
  fi
  return 1
}

failed=()
if [ "$which_suites" = all ] || [ "$which_suites" = pg_regress ]; then
  run_suite pg_regress "$PG_REGRESS" tests/pg_regress pg_intent_regress || failed+=(pg_regress)
fi
if [ "$which_suites" = all ] || [ "$which_suites" = isolation ]; then
  run_suite isolation "$PG_ISOLATION_REGRESS" tests/isolation pg_intent_isolation || failed+=(isolation)
fi

if [ ${#failed[@]} -gt 0 ]; then
  die "failed: ${failed[*]} (diffs above; results in tests/*/results)"
fi
log "SQL suites passed"

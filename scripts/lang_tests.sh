#!/usr/bin/env bash
# The four failure points again, from Python (psycopg 3, tests/python) and Node.js
# (node-postgres, tests/node), through the SQL API alone: a throwaway cluster with the installed
# extension, one database per language, every protocol call made by an ordinary login role in
# intent_app (an intent_operator one abandons attempts and reads the tables, an intent_admin one
# defines the contract).
#
# Installs what the suites need, idempotently, from the package registries only: a venv under
# ${XDG_CACHE_HOME:-$HOME/.cache}/pg_intent/venv (pip install -r tests/python/requirements.txt)
# and tests/node/node_modules (npm ci from package-lock.json); each is redone only when its pins,
# or the interpreter, change. The extension must be installed already (scripts/test.sh does it).
#
# Usage: bash scripts/lang_tests.sh             both suites (part of scripts/test.sh)
#        bash scripts/lang_tests.sh mutations   each failure point's mutation (tests/mutations)
#                                               must make both suites fail
# PG_INTENT_TESTS_SABOTAGE=FILE applies FILE, a mutation, to both databases (as the Rust
# tests' harness does): the suites must then fail. PG_INTENT_TARGET chooses the cluster (native,
# native-distributed, citus: scripts/lib.sh start_cluster and prepare_target_db;
# scripts/conformance.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

if [ "${1:-}" = mutations ]; then
  # caught: both suites ran and each had failing tests; MISSED: one of them still passed.
  bad=0
  logs="$(mktemp -d /tmp/pg_intent_lang_mutations.XXXXXX)"
  for m in check_then_insert params_ignored timeout_is_failure lapsed_lease_is_failure last_writer_wins generic_errors; do
    out="$logs/$m.log"
    PG_INTENT_TESTS_SABOTAGE="$ROOT/tests/mutations/$m.sql" bash "$0" >"$out" 2>&1 || true
    py=$(sed -nE 's/^([0-9]+) failed.* in [0-9.]+s.*/\1/p' "$out" | tail -n1)
    js=$(sed -nE 's/^[^ ]+ fail ([0-9]+)$/\1/p' "$out" | tail -n1)
    if grep -q "sabotaged with" "$out" && [ "${py:-0}" -gt 0 ] && [ "${js:-0}" -gt 0 ]; then
      echo "caught  $m: $py Python and $js Node.js tests fail"
    else
      echo "MISSED  $m: Python failed ${py:-0}, Node.js ${js:-0} (see $out)"
      bad=1
    fi
  done
  exit $bad
fi
[ $# -eq 0 ] || die "usage: $0 [mutations]"

CACHE="${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/pg_intent"
VENV="$CACHE/venv"
export PG_INTENT_APP_ROLE=intent_lang_app PG_INTENT_OPERATOR_ROLE=intent_lang_operator PG_INTENT_ADMIN_ROLE=intent_lang_admin

# The interpreters: the machine's python3 (with venv) and node with npm, else Debian's.
ensure_interpreters() {
  local missing=()
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3 python3-venv)
  { command -v node && command -v npm; } >/dev/null 2>&1 || missing+=(nodejs npm)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing Debian packages for the language tests (missing: ${missing[*]})"
  as_root apt-get update -q
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q "${missing[@]}"
}

install_python() {
  local want
  want="$(python3 -c 'import sys; print(sys.executable, sys.version.split()[0])') $(sha256sum tests/python/requirements.txt | cut -d' ' -f1)"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.pg_intent-stamp" 2>/dev/null)" = "$want" ]; then return; fi
  log "installing the Python tests' requirements into $VENV"
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input -r tests/python/requirements.txt
  echo "$want" >"$VENV/.pg_intent-stamp"
}

install_node() {
  local want stamp=tests/node/node_modules/.pg_intent-stamp
  want="$(node --version) $(sha256sum tests/node/package-lock.json | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return; fi
  log "npm ci in tests/node (node-postgres, as package-lock.json pins it)"
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error --cache "$CACHE/npm")
  echo "$want" >"$stamp"
}

ensure_interpreters
install_python
install_node

start_cluster
sql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
# A mutation (tests/mutations/*.sql) replaces API functions with broken ones; run with
# PG_INTENT_TESTS_SABOTAGE=FILE, the suites must then fail. A replacement runs with pg_intent's
# rights, as the C function it replaces did, so that an ordinary role's call reaches the bug
# instead of being refused for lack of privileges.
SABOTAGE_RIGHTS=$(cat <<'SQL'
DO $$
DECLARE f regprocedure;
BEGIN
  FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'intent'::regnamespace
              AND p.prolang <> (SELECT oid FROM pg_catalog.pg_language WHERE lanname = 'c')
              AND (p.proowner <> 'intent_owner'::regrole OR NOT p.prosecdef)
  LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO intent_owner', f);
    EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER', f);
  END LOOP;
END $$
SQL
)
for db in lang_python lang_node; do
  sql -d postgres -c "CREATE DATABASE $db"
  prepare_target_db "$db" || die "cannot prepare database $db for target $(target)"
  sql -d "$db" -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_intent"
  if [ -n "${PG_INTENT_TESTS_SABOTAGE:-}" ]; then
    sql -d "$db" -c "$(cat "$PG_INTENT_TESTS_SABOTAGE")" -c "$SABOTAGE_RIGHTS"
  fi
done
[ -z "${PG_INTENT_TESTS_SABOTAGE:-}" ] || log "sabotaged with $PG_INTENT_TESTS_SABOTAGE: the suites must fail"
# The extension created intent_app, intent_operator and intent_admin; the tests log in as
# ordinary roles granted them, never as a superuser.
sql -d lang_python <<SQL
CREATE ROLE $PG_INTENT_APP_ROLE LOGIN NOSUPERUSER IN ROLE intent_app;
CREATE ROLE $PG_INTENT_OPERATOR_ROLE LOGIN NOSUPERUSER IN ROLE intent_operator;
CREATE ROLE $PG_INTENT_ADMIN_ROLE LOGIN NOSUPERUSER IN ROLE intent_admin;
SQL

# Real TCP connections, as an application's.
export PGHOST=127.0.0.1
unset PGUSER
status=0
log "Python $("$VENV/bin/python" -c 'import sys, psycopg; print(sys.version.split()[0], "/ psycopg", psycopg.__version__)'): tests/python"
PGDATABASE=lang_python PYTHONDONTWRITEBYTECODE=1 \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir tests/python tests/python || status=1
log "Node.js $(node --version) / node-postgres $(node -p 'require("./tests/node/node_modules/pg/package.json").version'): tests/node"
(cd tests/node && PGDATABASE=lang_node node --test --test-reporter=spec failure_points.test.js) || status=1
stop_cluster
[ "$status" = 0 ] || die "the language tests failed"
log "the failure points passed from Python and Node.js"

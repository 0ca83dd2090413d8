#!/usr/bin/env bash
# pgtle_smoke.sh MAJOR: does pg_tle work, for a role that is not a superuser, on the tree the
# portable engine (issue 26) will be tested on? (tests/README.md § pg_tle)
#
# Builds that tree if needed (lib.sh: install_pg_tle), starts a throwaway cluster from it with
# shared_preload_libraries = 'pg_tle', and plays what an RDS or Supabase user does: the
# platform (a superuser) creates pg_tle; a cloud admin (no superuser; CREATEROLE, CREATEDB,
# CREATE on the database, member of pgtle_admin, like rds_superuser) installs a SQL-only
# extension with pgtle.install_extension, creates it, calls it, installs an update path and
# updates it, and is refused a name whose control file is on disk. Prints each step; exits
# non-zero if any step is not as expected. Prints that it skipped, and exits 0, when the
# vendored pg_tle source is absent. Not run by scripts/test.sh yet.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MAJOR="${1:-}"
[[ "$MAJOR" =~ ^[0-9]+$ ]] || die "usage: scripts/pgtle_smoke.sh MAJOR   (e.g. 15 or 18)"

BIN="$(install_pg_tle "$MAJOR")"
if [ -z "$BIN" ]; then
  log "pg_tle smoke on PostgreSQL $MAJOR: skipped: no $VENDOR_DIR/pg_tle-$PG_TLE_VERSION.tar.gz"
  exit 0
fi

PG_BIN="$BIN"
export PG_INTENT_TARGET=native
CLUSTER_OPTS="-c shared_preload_libraries=pg_tle" start_cluster

DB=smoke
ADMIN=cloud_admin
SHARE="$("$PG_BIN/pg_config" --sharedir)/extension"
FAILED=0

# run ROLE DB: the SQL on stdin as ROLE in DB; prints what psql printed (errors with their
# SQLSTATE), returns psql's status.
run() {
  { printf '\\set VERBOSITY verbose\n'; cat; } \
    | "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -U "$1" -d "$2" 2>&1 | grep -v '^LOCATION:'
  return "${PIPESTATUS[1]}"
}
report() { # report OK|FAIL ROLE WHAT OUTPUT
  printf '%-4s [%s] %s\n' "$1" "$2" "$3"
  [ -z "$4" ] || printf '       %s\n' "${4//$'\n'/$'\n'       }"
  [ "$1" = ok ] || FAILED=$((FAILED + 1))
}
# expect ROLE EXPECTED WHAT: the SQL on stdin succeeds, and prints EXPECTED (all its output,
# rows joined by "; ") unless EXPECTED is "-".
expect() {
  local role="$1" expected="$2" what="$3" out status=0
  out="$(run "$role" "$DB")" || status=$?
  out="${out//$'\n'/; }"
  if [ "$status" = 0 ] && { [ "$expected" = - ] || [ "$out" = "$expected" ]; }; then
    report ok "$role" "$what" "$out"
  else
    report FAIL "$role" "$what (wanted success, printing \"$expected\")" "$out"
  fi
}
# refused ROLE SQLSTATE WHAT: the SQL on stdin fails with that SQLSTATE.
refused() {
  local role="$1" code="$2" what="$3" out status=0
  out="$(run "$role" "$DB")" || status=$?
  if [ "$status" != 0 ] && grep -q "ERROR:  $code:" <<<"$out"; then
    report ok "$role" "$what" "$(grep 'ERROR:' <<<"$out")"
  else
    report FAIL "$role" "$what (wanted ERROR $code)" "$out"
  fi
}

log "pg_tle $PG_TLE_VERSION smoke: $("$PG_BIN/pg_config" --version) from $(dirname "$PG_BIN")"

# The tree: pg_tle, and no pg_intent (pg_tle would refuse the name, CREATE EXTENSION would
# take the file); pg_stat_statements' control file, the name to be refused below.
for f in "$SHARE/pg_tle.control" "$SHARE/pg_stat_statements.control"; do
  if [ -f "$f" ]; then report ok tree "on disk: ${f#"$(dirname "$PG_BIN")"/}" ""; else report FAIL tree "on disk: $f" "missing"; fi
done
stray="$(find "$SHARE" "$("$PG_BIN/pg_config" --pkglibdir)" -maxdepth 1 -name 'pg_intent*' -printf '%f ')"
if [ -z "$stray" ]; then report ok tree "no pg_intent files in the tree" ""; else report FAIL tree "no pg_intent files in the tree" "$stray"; fi

# The platform's part, as the superuser postgres.
"$PG_BIN/psql" -X -q -U postgres -d postgres -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB" >/dev/null
expect postgres "pg_tle" "shared_preload_libraries" <<<"SHOW shared_preload_libraries"
expect postgres - "the cloud admin: LOGIN NOSUPERUSER CREATEROLE CREATEDB, CREATE on database $DB" <<SQL
CREATE ROLE $ADMIN LOGIN NOSUPERUSER CREATEROLE CREATEDB;
GRANT CREATE ON DATABASE $DB TO $ADMIN;
SQL
expect $ADMIN "f" "the cloud admin is not a superuser" <<<"SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
# pg_tle.control has neither trusted nor superuser = false: CREATE EXTENSION pg_tle is the
# superuser's (on RDS the platform allows rds_superuser; Supabase ships it created).
refused $ADMIN 42501 "CREATE EXTENSION pg_tle is refused to the cloud admin" <<<"CREATE EXTENSION pg_tle"
expect postgres - "CREATE EXTENSION pg_tle (creates role pgtle_admin); GRANT pgtle_admin TO $ADMIN" <<SQL
CREATE EXTENSION pg_tle;
GRANT pgtle_admin TO $ADMIN;
SQL

# The cloud admin's part.
expect $ADMIN "t" "pgtle.install_extension('hello_tle', '1.0', ...)" <<'SQL'
SELECT pgtle.install_extension('hello_tle', '1.0', 'smoke', $$CREATE FUNCTION hello() RETURNS text LANGUAGE sql AS 'SELECT ''hi''';$$)
SQL
expect $ADMIN "hello_tle|1.0|f|f" "pgtle.available_extensions() lists it" <<'SQL'
SELECT name, default_version, superuser, trusted FROM pgtle.available_extensions() WHERE name = 'hello_tle'
SQL
# A TLE's script runs as the role that creates it: from PostgreSQL 15 on, public is not
# writable by a role that does not own the database.
refused $ADMIN 42501 "CREATE EXTENSION hello_tle into public is refused (public is not the admin's)" <<<"CREATE EXTENSION hello_tle"
expect $ADMIN "hi|$ADMIN" "CREATE SCHEMA app; CREATE EXTENSION hello_tle SCHEMA app; app.hello(), owner" <<'SQL'
CREATE SCHEMA app;
CREATE EXTENSION hello_tle SCHEMA app;
SELECT app.hello(), extowner::regrole FROM pg_extension WHERE extname = 'hello_tle';
SQL
expect $ADMIN "t; t" "pgtle.install_update_path('hello_tle', '1.0', '1.1', ...); pgtle.set_default_version(.., '1.1')" <<'SQL'
SELECT pgtle.install_update_path('hello_tle', '1.0', '1.1', $$CREATE OR REPLACE FUNCTION hello() RETURNS text LANGUAGE sql AS 'SELECT ''hi from 1.1''';$$);
SELECT pgtle.set_default_version('hello_tle', '1.1');
SQL
expect $ADMIN "1.1|hi from 1.1" "ALTER EXTENSION hello_tle UPDATE; extversion, app.hello()" <<'SQL'
ALTER EXTENSION hello_tle UPDATE;
SELECT extversion, app.hello() FROM pg_extension WHERE extname = 'hello_tle';
SQL
# pg_tle's install functions refuse a name whose control file is on disk
# (tleextension.c: filestat(get_extension_control_filename(name)), ERRCODE 55000).
refused $ADMIN 55000 "pgtle.install_extension('pg_stat_statements', ...) is refused (its control file is on disk)" <<'SQL'
SELECT pgtle.install_extension('pg_stat_statements', '1.0', 'shadow', $$SELECT 1;$$)
SQL
expect $ADMIN "t; 0" "DROP EXTENSION hello_tle; pgtle.uninstall_extension('hello_tle')" <<'SQL'
DROP EXTENSION hello_tle;
SELECT pgtle.uninstall_extension('hello_tle');
SELECT count(*) FROM pgtle.available_extensions() WHERE name = 'hello_tle';
SQL

if [ "$FAILED" = 0 ]; then
  log "pg_tle smoke on PostgreSQL $MAJOR: every step as expected"
else
  log "pg_tle smoke on PostgreSQL $MAJOR: $FAILED step(s) not as expected"
  exit 1
fi

#!/usr/bin/env bash
# Mutation checks: each file here breaks the extension on purpose (only inside the throwaway
# databases the integration tests create, through PG_INTENT_TESTS_SABOTAGE) and the test binary
# named next to it must then FAIL. A mutation that passes means the tests are blind to that bug.
#
# A broken mutation proves nothing either, and it breaks in two ways. A file that does not
# apply makes fresh_db panic, so every test "fails" without testing anything. A PL/pgSQL wrapper
# that calls a function which no longer exists applies fine (PL/pgSQL resolves names only when
# it runs) and then fails every call with 42883, which looks just as "caught". So each file is
# first applied to a scratch database of a throwaway cluster, exactly as fresh_db applies it
# (right after CREATE EXTENSION, the whole file as one simple-protocol query), and every
# `intent.<name>` that a non-C function body of schema intent mentions must exist there. Only
# then does the test binary run, and its failures must not be such errors either.
#
# Per mutation, one line:
#   caught  the target binary fails (the names of its failing tests follow; read the log to
#           see that they fail for the mutation's reason)
#   MISSED  the target binary still passes: the tests are blind to that bug
#   BROKEN  the file does not apply, names something that does not exist, or the tests failed
#           on an error that says the mutation no longer fits the extension
#   ERROR   the target binary failed without running its tests (build error, no such binary)
# Exit status 1 unless every mutation is caught. Logs: /tmp/mutation-<file>.log
# (/tmp/mutation-<target>-<file>.log for another target).
#
# PG_INTENT_TARGET (native, native-distributed, citus: tests/README.md § Targets) chooses what
# the tests and the scratch cluster run against; for a target other than native, only the
# mutations whose binary is in that target's conformance suite (scripts/conformance.sh) run, and
# the others are listed as not applicable.
# Usage: bash tests/mutations/run.sh [mutation.sql ...]   (default: every mutation listed below)
#        PG_INTENT_TARGET=citus bash tests/mutations/run.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"

LIST=$(cat <<'LIST'
check_then_insert.sql double_click
params_ignored.sql same_key_different_input
timeout_is_failure.sql timeout
lapsed_lease_is_failure.sql timeout
last_writer_wins.sql reverse_order_finish
swallow_serialization_failure.sql isolation_levels
generic_errors.sql sqlstates
share_the_attempt.sql concurrent_begin
model_last_writer_wins.sql model_check
model_heartbeat_revives.sql model_check
model_fail_always_retries.sql model_check
model_cancel_keeps_version.sql model_check
security_public_grants.sql security
security_unpinned_search_path.sql security
security_rls_not_forced.sql security
reliability_second_winner.sql storm
reliability_arbiter_on_key_only.sql storm
reliability_unlogged_tables.sql crash
reliability_noop_that_writes.sql hostile_input
threat_views_owner_rights.sql threat_model
threat_drop_guard_as_caller.sql threat_model
LIST
)
if [ $# -gt 0 ]; then
  LIST=$(for m in "$@"; do
    grep -E "^$(basename "$m") " <<<"$LIST" || die "$m is not in the list of tests/mutations/run.sh"
  done) || exit 1
fi

# Every .sql file here must be listed: an unlisted mutation would never be checked.
for f in tests/mutations/*.sql; do
  grep -qE "^$(basename "$f") " <<<"$LIST" || [ $# -gt 0 ] \
    || die "$f is not listed in tests/mutations/run.sh"
done

TARGET="$(target)"
export PG_INTENT_TARGET="$TARGET"
if [ "$TARGET" != native ]; then
  CONFORMANCE=" $(bash "$ROOT/scripts/conformance.sh" "$TARGET" --list | tr '\n' ' ') "
  while read -r mutation binary; do
    [[ "$CONFORMANCE" == *" $binary "* ]] \
      || echo "n/a     $mutation: tests/$binary.rs is not in the conformance suite of $TARGET"
  done <<<"$LIST"
  LIST=$(while read -r mutation binary; do
    [[ "$CONFORMANCE" != *" $binary "* ]] || echo "$mutation $binary"
  done <<<"$LIST")
fi

log "building the test binaries"
cargo test -q -p pg_intent_tests --no-run 2>/tmp/mutation-build.log \
  || { cat /tmp/mutation-build.log; die "the integration tests do not build"; }

start_cluster
PSQL=("$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1)

# Every intent.<name> a function body of schema intent mentions (other than the C functions,
# whose "body" is a symbol) must be a function, relation, type or setting that exists.
MISSING_NAMES=$(cat <<'SQL'
SELECT format('%s names intent.%s, which does not exist', p.oid::regprocedure, m[1])
  FROM pg_catalog.pg_proc p, pg_catalog.regexp_matches(p.prosrc, 'intent\.([a-z_][a-z0-9_]*)', 'gi') m
 WHERE p.pronamespace = 'intent'::regnamespace
   AND p.prolang <> (SELECT oid FROM pg_catalog.pg_language WHERE lanname = 'c')
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_proc q WHERE q.pronamespace = p.pronamespace AND q.proname = lower(m[1]))
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.relnamespace = p.pronamespace AND c.relname = lower(m[1]))
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_type t WHERE t.typnamespace = p.pronamespace AND t.typname = lower(m[1]))
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_settings s WHERE s.name = 'intent.' || lower(m[1]))
SQL
)

# Errors in a test's output that mean the mutation does not fit the extension any more (it calls
# or reads something that is not there, or returns the wrong shape), not that a test caught it.
UNFIT='SqlState\(E(42883|42703|42804|42601)\)|code: "(42883|42703|42804|42601)"|function intent\.[A-Za-z0-9_]+\([^)]*\) does not exist|relation \\?"intent\.[A-Za-z0-9_]+\\?" does not exist'
# On citus, Citus refusing to plan the mutation's SQL is no catch either.
[ "$TARGET" != citus ] || UNFIT="$UNFIT"'|could not create distributed plan|requires repartitioning|cannot perform distributed planning|STABLE functions used in UPDATE queries|complex joins are only supported|no unique or exclusion constraint matching the ON CONFLICT'

# apply FILE: applies FILE to a new scratch database as fresh_db does, then looks for names
# that do not exist; prints what is wrong, if anything.
apply() {
  local db missing
  db="mutation_$(basename "$1" .sql)"
  "${PSQL[@]}" -d postgres -c "CREATE DATABASE $db" 2>&1 || return 1
  # On citus: the database on every node, pg_intent created and distributed, as fresh_db does.
  prepare_target_db "$db" 2>&1 || return 1
  "${PSQL[@]}" -d "$db" -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_intent" 2>&1 || return 1
  # -c sends the whole file as one query, as tokio-postgres' batch_execute does in fresh_db.
  "${PSQL[@]}" -d "$db" -c "$(cat "$1")" 2>&1 || return 1
  # (The library loaded first: a setting such as intent.allow_checker_drop is in pg_settings
  # only once it is.)
  missing=$("${PSQL[@]}" -At -d "$db" -c "LOAD 'pg_intent'" -c "$MISSING_NAMES" 2>&1) || { echo "$missing"; return 1; }
  [ -z "$missing" ] || { echo "$missing"; return 1; }
}

bad=0
while read -r mutation binary; do
  file="$PWD/tests/mutations/$mutation"
  log="/tmp/mutation-$mutation.log"
  [ "$TARGET" = native ] || log="/tmp/mutation-$TARGET-$mutation.log"
  if [ ! -f "$file" ]; then
    echo "BROKEN  $mutation: no such file"; bad=1; continue
  fi
  if ! error=$(apply "$file"); then
    printf '%s\n' "$error" >"$log"
    echo "BROKEN  $mutation: $(head -c 300 <<<"$error" | tr '\n' ' ')"; bad=1; continue
  fi
  # The tests the conformance suite skips on this target (scripts/conformance.sh) are skipped here.
  skips=()
  if [ "$TARGET" != native ]; then
    while read -r t; do [ -z "$t" ] || skips+=(--skip "$t"); done < <(bash "$ROOT/scripts/conformance.sh" "$TARGET" --skips "$binary")
  fi
  if PG_INTENT_TESTS_SABOTAGE="$file" RUST_BACKTRACE=0 \
       cargo test -q -p pg_intent_tests --test "$binary" -- --test-threads=1 "${skips[@]}" >"$log" 2>&1; then
    echo "MISSED  $mutation: tests/$binary.rs still passes"; bad=1
  elif grep -qF "sabotage $file:" "$log"; then
    echo "BROKEN  $mutation: fresh_db could not apply it (see $log)"; bad=1
  elif unfit=$(grep -m1 -oE "$UNFIT" "$log" | head -n1) && [ -n "$unfit" ]; then
    echo "BROKEN  $mutation: tests/$binary.rs fails on errors the mutation itself causes ($unfit; see $log)"; bad=1
  elif ! grep -q '^test result: FAILED' "$log"; then
    echo "ERROR   $mutation: tests/$binary.rs did not run (see $log)"; bad=1
  else
    failed=$(sed -n 's/^---- \(.*\) stdout ----$/\1/p' "$log" | tr '\n' ' ')
    echo "caught  $mutation: $(grep -c '^---- .* stdout ----$' "$log") test(s) of tests/$binary.rs fail: $failed"
  fi
done <<<"$LIST"
exit $bad

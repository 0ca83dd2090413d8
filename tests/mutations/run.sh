#!/usr/bin/env bash
# Mutation checks: each file here breaks the extension on purpose (only inside the throwaway
# databases the integration tests create, through PG_INTENT_TESTS_SABOTAGE) and the test binary
# named next to it must then FAIL. A mutation that passes means the tests are blind to that bug.
# Usage: bash tests/mutations/run.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
missed=0
while read -r mutation binary; do
  if PG_INTENT_TESTS_SABOTAGE="$PWD/tests/mutations/$mutation" RUST_BACKTRACE=0 \
       cargo test -q -p pg_intent_tests --test "$binary" -- --test-threads=1 >"/tmp/mutation-$mutation.log" 2>&1; then
    echo "MISSED  $mutation: tests/$binary.rs still passes"; missed=1
  else
    echo "caught  $mutation: $(grep -c -- '--- FAILED' "/tmp/mutation-$mutation.log") test(s) of tests/$binary.rs fail"
  fi
done <<'LIST'
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
LIST
exit $missed

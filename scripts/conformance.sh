#!/usr/bin/env bash
# The conformance suite: one list of suites, run against one target, the way a driver test
# suite takes a driver (tests/README.md § Targets). A target is what the tests run against:
#   native              one node, the single-node statements (what the full run covers)
#   native-distributed  one node with intent.force_distributed_statements=on: the distributed
#                       mode's statements, without Citus
#   citus               a coordinator and two workers on loopback, every test database
#                       distributed by intent.distribute() (the server of PG_INTENT_CITUS_BIN,
#                       default PG_INTENT_PG_BIN's, must have Citus)
# PG_INTENT_TARGET carries it to every suite: the Rust harness (tests/cluster: Cluster::shared,
# fresh_db), scripts/regress.sh and scripts/lang_tests.sh (scripts/lib.sh: start_cluster,
# prepare_target_db) start and prepare clusters of that target, so the same tests and the same
# expected files run unchanged on each.
#
# The extension must be installed already (scripts/test.sh does it). A suite that fails does
# not stop the others; the script prints each suite's time and exits 1 if any failed.
#
# Usage: bash scripts/conformance.sh TARGET            run the suite on TARGET
#        bash scripts/conformance.sh TARGET --list     the suites that run on TARGET, one a line
#        bash scripts/conformance.sh TARGET --skips S  the tests of suite S skipped on TARGET
# PG_INTENT_TESTS_SABOTAGE=FILE (tests/mutations) is passed through to every suite.
# PG_INTENT_CONFORMANCE_ONLY="suite …" runs only those of the list.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

# The conformance suite, written once. One suite a line: its name, then the targets it does
# not run on (or -), then why. A suite is `regress` (pg_regress and isolation,
# scripts/regress.sh), `lang` (Python and Node.js, scripts/lang_tests.sh), or the name of a test
# binary of tests/tests. Tests that cannot apply to any target (crashing or restarting the
# server, pg_upgrade) are not in it.
SUITES=$(cat <<'LIST'
regress                  -      the SQL API's answers, and the concurrent cases step by step
model_check              -      random call sequences against the model and the transition table
double_click             -      failure point 1
same_key_different_input -      failure point 2
timeout                  -      failure point 3
reverse_order_finish     -      failure point 4
retries                  -      the default backoff and retry_after (the backoff rule, written once for every mode)
claim_contention         -      a claim goes past the jobs other transactions hold
claim_start              -      where a backend's claims start, and the whole read every intent.claim_rescan
retention                -      the default retention, 'never', intent.settings before the library loads, concurrent purges beside a claim
lang                     -      the four failure points from Python and Node.js, as ordinary roles
host_database            citus  starts its own single-node servers, one per way of loading the library
security                 -      owner isolation, privileges, definer rights
threat_model             -      the escape routes of docs/security.md, each attacked by a real login role
storm                    -      many connections on the same jobs (short: PG_INTENT_STORM_ROUNDS)
LIST
)

# The pg_regress and isolation tests a target cannot run, and why (PG_INTENT_REGRESS_SKIP).
# On citus: schema reads the catalog, which distribute() changes by design (docs/scale-out.md:
# constraints, shard tables); contracts runs checkers that read distributed tables from a
# function Citus pushes to a shard, and creates temporary functions Citus warns about;
# submit_repeatable_read expects 40001 from a REPEATABLE READ snapshot, which Citus does not
# keep across nodes or roles: the caller's read takes its snapshot on the worker over the
# caller's connection, while submit_job writes as intent_owner over a connection of its own,
# whose snapshot starts at its first statement — after the other session's commit, so it finds
# the job (created = false) where a single node raises 40001. (claims and claim_concurrent run:
# they name claimed jobs through keys recorded before the claim, not by reading intent.jobs in
# the claim's statement, which Citus refuses after a call that wrote as intent_owner.)
regress_skip() { # regress_skip TARGET
  case "$1" in
    citus) echo "contracts schema submit_repeatable_read" ;;
    *) echo "" ;;
  esac
}

# Single tests of a Rust suite that a target cannot run (cargo test --skip): target, suite,
# test, why.
SKIPS=$(cat <<'LIST'
citus  security  parallel::every_read_through_parallel_workers_is_bound_as_in_the_leader  Citus cannot run the test's probe, a UNION of domain-typed columns in a PL/pgSQL function run by parallel workers ("attribute 1 of type record has wrong type")
citus  security  shadows::nothing_planted_in_public_or_pg_temp_is_ever_used  a known limit (docs/security.md § Known limits): on Citus a read of the views runs pg_catalog functions by name under the reader's search_path (Citus sends shard queries as text); the calls are not affected
citus  threat_model  a_session_level_binding_binds_each_transaction  a documented limit (docs/scale-out.md § Row-level security): on Citus a direct read is isolated only for a role bound with ALTER ROLE … SET; a gateway bound by SET or SET LOCAL reads unbound on the workers, and this attack reads directly
citus  threat_model  a_reset_before_a_parallel_index_build_does_not_reach_its_workers  the same documented limit: the attack's parallel workers read the tables directly as a gateway bound by SET LOCAL
citus  threat_model  a_binding_cannot_change_within_a_transaction  Citus cannot run the attack's parallel step: a distributed read from a PostgreSQL parallel worker in a transaction that wrote fails ("cannot use 2PC in transactions involving multiple servers", 0A000) before anything is tested
citus  threat_model  a_binding_dropped_by_a_parallel_first_load_is_refused  as above: the forced parallel read fails with 0A000 ("cannot use 2PC …") on Citus
citus  threat_model  a_reset_during_executor_start_does_not_reach_the_workers  as above: the forced parallel read fails with 0A000 ("cannot use 2PC …") on Citus
citus  threat_model  a_first_load_in_parallel_mode_keeps_the_binding  Citus cannot read a distributed table from a PostgreSQL parallel worker here: the read fails (22P04, "row field count is …" / "COPY file signature not recognized") before anything is tested
citus  threat_model  a_checker_sees_no_owners_rows  its checkers read pg_intent's distributed tables: on Citus the read sends the checker's binding to a worker as the checker's owner, who may not set intent.owner_id there, and define_contract fails (42501, closed) before anything is tested
LIST
)

# Sizes in the conformance run: the storm (the full run's default is 12 rounds) and, on citus,
# the model check (each case's reset and reads fan out to every shard: 128 cases take ten
# minutes there).
STORM_ROUNDS="${PG_INTENT_STORM_ROUNDS:-4}"
MODEL_CASES_CITUS="${PG_INTENT_MODEL_CASES:-32}"

t="${1:-}"
[[ " $TARGETS " == *" $t "* ]] || die "usage: $0 TARGET [--list]   (TARGET: $TARGETS)"
export PG_INTENT_TARGET="$t"

suites_for() { # suites_for TARGET: the names of the suites that run on TARGET
  awk -v t="$1" '{ n = split($2, not_on, ","); skip = 0; for (i = 1; i <= n; i++) if (not_on[i] == t) skip = 1; if (!skip) print $1 }' <<<"$SUITES"
}

if [ "${2:-}" = --list ]; then
  suites_for "$t"
  exit 0
fi
if [ "${2:-}" = --skips ]; then # --skips SUITE: the tests of SUITE skipped on TARGET, one a line
  awk -v t="$t" -v s="${3:-}" '$1 == t && $2 == s { print $3 }' <<<"$SKIPS"
  exit 0
fi
[ $# -eq 1 ] || die "usage: $0 TARGET [--list | --skips SUITE]"

run_suite() { # run_suite NAME
  local skip=() target suite test
  while read -r target suite test _; do
    [ "$target" = "$t" ] && [ "$suite" = "$1" ] && skip+=(--skip "$test")
  done <<<"$SKIPS"
  case "$1" in
    regress) env -u PGHOST PG_INTENT_REGRESS_SKIP="$(regress_skip "$t")" bash "$ROOT/scripts/regress.sh" ;;
    lang) env -u PGHOST bash "$ROOT/scripts/lang_tests.sh" ;;
    storm) PG_INTENT_STORM_ROUNDS="$STORM_ROUNDS" cargo test -q -p pg_intent_tests --test storm -- --test-threads=1 "${skip[@]}" ;;
    model_check)
      if [ "$t" = citus ]; then export PG_INTENT_MODEL_CASES="$MODEL_CASES_CITUS"; fi
      cargo test -q -p pg_intent_tests --test model_check -- --test-threads=1 "${skip[@]}"
      ;;
    *) cargo test -q -p pg_intent_tests --test "$1" -- --test-threads=1 "${skip[@]}" ;;
  esac
}

log "the conformance suite on target $t"
# Built first, so that a suite's time is its run's.
cargo test -q -p pg_intent_tests --no-run
times=()
failed=()
started=$SECONDS
for suite in $(suites_for "$t"); do
  if [ -n "${PG_INTENT_CONFORMANCE_ONLY:-}" ] && [[ " $PG_INTENT_CONFORMANCE_ONLY " != *" $suite "* ]]; then
    continue
  fi
  log "conformance ($t): $suite"
  s=$SECONDS
  run_suite "$suite" || failed+=("$suite")
  times+=("$(printf '%-26s %4ds' "$suite" $((SECONDS - s)))")
done
log "conformance on $t: $((SECONDS - started))s"
printf '  %s\n' "${times[@]}" >&2
[ ${#failed[@]} -eq 0 ] || die "conformance on $t failed: ${failed[*]}"
log "conformance on $t passed"

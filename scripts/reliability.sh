#!/usr/bin/env bash
# The reliability figures: runs the storm, crash and hostile-input suites of the integration
# tests (tests/tests/storm.rs, crash.rs, hostile_input/, rust_backtrace.rs) against real
# PostgreSQL 15 servers they start themselves on 127.0.0.1, and prints what they did and found:
# rounds, connections, crash cycles survived, inputs tried, violations.
#
# Usage:
#   bash scripts/reliability.sh           # the full form: 64 connections x 1,000 storm rounds,
#                                         # 24 crash cycles, 10,000 hostile inputs (~10 minutes
#                                         # on 2 cores)
#   bash scripts/reliability.sh --short   # the shortened form CI runs (about a minute)
#
# Environment: PG_INTENT_SEED=<n> replays a run (each test prints its seed); the sizes can be
# set one by one: PG_INTENT_STORM_ROUNDS, PG_INTENT_STORM_CONNECTIONS, PG_INTENT_CRASH_CYCLES,
# PG_INTENT_CRASH_WORKERS, PG_INTENT_COMMIT_KILLS, PG_INTENT_HOSTILE_INPUTS; PG_INTENT_PG_BIN
# points at the server binaries. The extension must be installed into the PostgreSQL 15 server
# (scripts/test.sh, or `cargo pgrx install`); run as root or as a user that may run initdb.
#
# It also runs the tests that are ignored because they reproduce a known extension bug, and
# says for each whether the bug is still there. Exit status: 0 when every suite passed with no
# violation (known bugs do not count), 1 otherwise. The full log is kept in $LOG (printed).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=full
case "${1:-}" in
  --short) mode=short ;;
  ""|--full) ;;
  *) echo "usage: bash scripts/reliability.sh [--short|--full]" >&2; exit 2 ;;
esac
if [ "$mode" = full ]; then export PG_INTENT_FULL=1; else unset PG_INTENT_FULL; fi
export RUST_BACKTRACE=0

LOG="${LOG:-$(mktemp /tmp/pg_intent_reliability.XXXXXX)}"
suites=(--test storm --test crash --test hostile_input --test rust_backtrace)
started=$(date +%s)

echo "pg_intent reliability ($mode form); log: $LOG"
status=0
if ! cargo test --no-fail-fast -p pg_intent_tests "${suites[@]}" -- --test-threads=1 --nocapture \
     >"$LOG" 2>&1; then
  status=1
fi
# The known extension bugs, reproduced by ignored tests: still there, or fixed?
cargo test --no-fail-fast -p pg_intent_tests "${suites[@]}" -- --ignored --test-threads=1 \
  >"$LOG.known-bugs" 2>&1
elapsed=$(( $(date +%s) - started ))

# Each suite prints one line: RELIABILITY test=<name> key=value ... seconds=<s>
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
echo
printf '| %-16s | %-62s | %10s | %8s |\n' suite "what it did" violations seconds
printf '|%s|%s|%s|%s|\n' "------------------" "----------------------------------------------------------------" "------------" "----------"
total_violations=0
while read -r line; do
  name=$(field test "$line")
  case "$name" in
    storm|storm_heartbeats)
      what="$(field rounds "$line") rounds x $(field connections "$line") connections, $(field calls "$line") calls" ;;
    crash)
      what="$(field cycles "$line") crash cycles ($(field sigkill "$line") SIGKILL, $(field immediate "$line") immediate), $(field acknowledged_calls "$line") acked calls" ;;
    commit_kill)
      what="$(field staged_kills "$line") staged + $(field racing_kills "$line") racing kills around COMMIT" ;;
    hostile)
      what="$(field inputs "$line") bad inputs, $(field families "$line") families" ;;
    *) what="" ;;
  esac
  v=$(field violations "$line")
  total_violations=$(( total_violations + ${v:-0} ))
  printf '| %-16s | %-62s | %10s | %8s |\n' "$name" "$what" "$v" "$(field seconds "$line")"
done < <(grep -h '^RELIABILITY ' "$LOG")

echo
grep -h '^RELIABILITY ' "$LOG" | sed 's/^RELIABILITY /  /'
echo
echo "duplicate jobs:  $(grep -h '^RELIABILITY test=storm ' "$LOG" | sed -n 's/.* duplicate_jobs=\([0-9]*\).*/\1/p')"
echo "second winners:  $(grep -h '^RELIABILITY test=storm ' "$LOG" | sed -n 's/.* second_winners=\([0-9]*\).*/\1/p')"
echo "violations:      $total_violations"
echo "wall time:       ${elapsed}s"

echo
echo "known extension bugs (ignored tests):"
grep -h '^test .* \.\.\. \(ok\|FAILED\)$' "$LOG.known-bugs" | while read -r _ name _ result; do
  if [ "$result" = ok ]; then
    echo "  FIXED   $name  (remove its #[ignore])"
  else
    echo "  present $name"
  fi
done
grep -h '^RELIABILITY ' "$LOG.known-bugs" | sed 's/^RELIABILITY /  figures of a known-bug run: /'

echo
if [ "$status" -ne 0 ]; then
  echo "FAILED: a suite failed; see $LOG"
  grep -h -A 12 '^---- .* stdout ----' "$LOG" | head -60
fi
exit "$status"

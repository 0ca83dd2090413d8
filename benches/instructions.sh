#!/usr/bin/env bash
# Instructions per call, this build against another build of the extension, counted by
# valgrind's callgrind in a single-user backend that starts each run from the same copy of one
# database. Unlike throughput on a shared 2-core machine, the count does not depend on what
# else runs: two runs of one build agree to a few instructions, so a difference of a fraction
# of a per cent is real. It counts work, not time (cache misses and locks are not in it): use
# it beside benches/run.py, not instead of it.
#
# Usage: bash benches/instructions.sh OLD_LIB NEW_LIB [PG_BIN [OLD_PG_BIN]]
#   OLD_LIB, NEW_LIB: pg_intent.so files built for the same major
#   PG_BIN: a PostgreSQL bin directory whose lib/ holds the extension (default Debian's 15);
#           the library file there is swapped for each run and put back at the end.
#   OLD_PG_BIN: when the two builds have different schemas, a second installation of the same
#           PostgreSQL build holding the old build's SQL files: the old side runs there, each
#           side in a database made by its own CREATE EXTENSION (default: PG_BIN, one schema).
set -euo pipefail
OLD="$(realpath "$1")"
NEW="$(realpath "$2")"
PG_BIN="${3:-/usr/lib/postgresql/15/bin}"
OLD_PG_BIN="${4:-$PG_BIN}"
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

WORK="$(mktemp -d /tmp/pg_intent_instructions.XXXXXX)"
chmod 777 "$WORK"
declare -A BIN LIB
BIN[old]="$OLD_PG_BIN"; BIN[new]="$PG_BIN"
for side in old new; do
  LIB[$side]="$("${BIN[$side]}/pg_config" --pkglibdir)/pg_intent.so"
  cp "${LIB[$side]}" "$WORK/saved-$side.so"
done
trap 'for side in old new; do cp "$WORK/saved-$side.so" "${LIB[$side]}.ab" && mv "${LIB[$side]}.ab" "${LIB[$side]}"; done; rm -rf "$WORK"' EXIT

single() { # single BIN DATADIR DB < SQL: a single-user backend
  as_pg "$1/postgres" --single -D "$2" -c synchronous_commit=off "$3" >/dev/null 2>&1
}
for side in old new; do
  cp "$([ "$side" = old ] && echo "$OLD" || echo "$NEW")" "${LIB[$side]}.ab" && mv "${LIB[$side]}.ab" "${LIB[$side]}"
  as_pg "${BIN[$side]}/initdb" -D "$WORK/pristine-$side" -U postgres --auth=trust >/dev/null
  echo "CREATE DATABASE bench;" | single "${BIN[$side]}" "$WORK/pristine-$side" postgres
  echo "CREATE EXTENSION pg_intent;" | single "${BIN[$side]}" "$WORK/pristine-$side" bench
done

# count SIDE LIB SQL: the instructions of one single-user backend running SQL, from the side's
# pristine copy.
count() {
  local side="$1" bin="${BIN[$1]}"
  cp "$2" "${LIB[$side]}.ab" && mv "${LIB[$side]}.ab" "${LIB[$side]}"
  rm -rf "$WORK/data" && cp -a "$WORK/pristine-$side" "$WORK/data"
  # Single-user mode ends a statement at each newline: one line per statement.
  echo "${3//$'\n'/ }" | as_pg valgrind --tool=callgrind --callgrind-out-file="$WORK/out" \
    "$bin/postgres" --single -D "$WORK/data" -c synchronous_commit=off bench >/dev/null 2>&1
  awk '/^(summary|totals):/ { print $2; exit }' "$WORK/out"
}

N=300
SUBMIT="DO \$\$ DECLARE j uuid; BEGIN FOR i IN 1..$N LOOP
  SELECT job_id INTO j FROM intent.submit_job('o', 'k-' || i, 'gpu-a', '{\"prompt\": \"a cat\"}'); END LOOP; END \$\$;"
LIFE="DO \$\$ DECLARE j uuid; a uuid; v bigint; BEGIN FOR i IN 1..$N LOOP
  SELECT job_id INTO j FROM intent.submit_job('o', 'k-' || i, 'gpu-a', '{\"prompt\": \"a cat\"}');
  SELECT attempt_id, version INTO a, v FROM intent.begin_attempt(j);
  PERFORM intent.complete_attempt(a, v, '{\"image\": \"x\"}'); END LOOP; END \$\$;"
REPLAY="DO \$\$ DECLARE j uuid; BEGIN FOR i IN 1..$N LOOP
  SELECT job_id INTO j FROM intent.submit_job('o', 'k-1', 'gpu-a', '{\"prompt\": \"a cat\"}'); END LOOP; END \$\$;"
RETRY="DO \$\$ DECLARE j uuid; a uuid; v bigint; BEGIN FOR i IN 1..$N LOOP
  SELECT job_id INTO j FROM intent.submit_job('o', 'r-' || i, 'gpu-a', '{\"prompt\": \"a cat\"}');
  SELECT attempt_id, version INTO a, v FROM intent.begin_attempt(j);
  PERFORM intent.heartbeat(a);
  PERFORM intent.fail_attempt(a, v, '{\"kind\": \"busy\"}', true, interval '0');
  SELECT attempt_id, version INTO a, v FROM intent.begin_attempt(j);
  PERFORM intent.complete_attempt(a, v, '{\"image\": \"x\"}'); END LOOP; END \$\$;"
UNKNOWN="DO \$\$ DECLARE j uuid; a uuid; v bigint; BEGIN FOR i IN 1..$N LOOP
  SELECT job_id INTO j FROM intent.submit_job('o', 'u-' || i, 'gpu-a', '{\"prompt\": \"a cat\"}');
  SELECT attempt_id, version INTO a, v FROM intent.begin_attempt(j);
  PERFORM intent.mark_unknown(a, 'timeout');
  PERFORM intent.abandon_attempt(a, 'no record');
  PERFORM intent.cancel_job(j, 'gave up'); END LOOP; END \$\$;"
CLAIM="DO \$\$ DECLARE a uuid; v bigint; BEGIN FOR i IN 1..$N LOOP
  PERFORM intent.submit_job('o', 'c-' || i, 'gpu-a', '{\"prompt\": \"a cat\"}');
  SELECT attempt_id, version INTO a, v FROM intent.claim_attempts(ARRAY['gpu-a'], 'w', '30 seconds', 1);
  PERFORM intent.complete_attempt(a, v, '{\"image\": \"x\"}'); END LOOP; END \$\$;"
BATCH="DO \$\$ BEGIN FOR i IN 1..$((N / 100)) LOOP
  PERFORM count(*) FROM intent.submit_jobs(array_fill('o'::text, ARRAY[100]),
    ARRAY(SELECT 'b-' || i || '-' || g FROM generate_series(1, 100) g), array_fill('gpu-a'::text, ARRAY[100]),
    array_fill('{}'::jsonb, ARRAY[100])); END LOOP; END \$\$;"

printf '%-34s %14s %14s %10s\n' "per call" "old" "new" "new÷old"
declare -A base
for side in old new; do
  lib="$OLD"; [ "$side" = new ] && lib="$NEW"
  base[$side]="$(count "$side" "$lib" "SELECT 1;")"
done
row() { # row LABEL SQL DIVISOR [SUBTRACT_LABEL]
  local o n
  o=$(( ($(count old "$OLD" "$2") - base[old]) ))
  n=$(( ($(count new "$NEW" "$2") - base[new]) ))
  echo "$1 $o $n $3"
}
{
  row "submit_job, a new key" "$SUBMIT" "$N"
  row "submit_job, a replay" "$REPLAY" "$N"
  row "submit, begin, complete" "$LIFE" "$N"
  row "submit_jobs, 100 new keys" "$BATCH" "$((N / 100))"
  row "retry: submit, begin, heartbeat, fail, begin, complete" "$RETRY" "$N"
  row "unknown: submit, begin, mark_unknown, abandon, cancel" "$UNKNOWN" "$N"
  row "worker: submit, claim_attempts, complete" "$CLAIM" "$N"
} | while read -r a b c d e f g h; do
  # label words, then old new divisor
  set -- $a $b $c $d $e $f $g $h
  args=("$@"); k=${#args[@]}
  div=${args[k-1]}; new=${args[k-2]}; old=${args[k-3]}
  label="${args[*]:0:k-3}"
  awk -v l="$label" -v o="$old" -v n="$new" -v d="$div" \
    'BEGIN { printf "%-34s %14.0f %14.0f %10.4f\n", l, o / d, n / d, n / o }'
done

#!/usr/bin/env bash
# The benchmarks: pg_intent against what a user would write instead, every pair measured in the
# same run on a throwaway cluster that benches/run.py starts and removes. Installs what is missing
# on a fresh machine first, like the other scripts. Results and their reading: docs/benchmarks.md.
# Usage: bash scripts/bench.sh [--quick] [--seconds N] [--clients N] [--markdown FILE]
#        bash scripts/bench.sh --majors [--seconds N] [--markdown FILE]   every major of pgrx.toml
#        bash scripts/bench.sh --workers [--quick] [--markdown FILE]   claims, NOTIFY, pickup (benches/run.py)
#        bash scripts/bench.sh --bound-claim [--quick] [--markdown FILE]   bound claims against other owners' queues
#        bash scripts/bench.sh --held-snapshot [--quick] [--markdown FILE]   claims behind jobs claimed under a held snapshot
#        bash scripts/bench.sh --peers [--quick]   against graphile-worker, pg-boss and procrastinate,
#                                                  installed at pinned versions (benches/peers/run.py;
#                                                  writes docs/comparison.md unless --quick)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
setup_all
if [ "${1:-}" = --majors ]; then
  shift
  install_majors
  pgrx_init
  spec=""
  for m in $PG_MAJORS; do
    use_major "$m"
    [ "$m" = "$DEFAULT_MAJOR" ] || install_extension
    spec+="$m:$PG_BIN "
  done
  exec python3 "$ROOT/benches/run.py" --majors "$spec" "$@"
fi
if [ "${1:-}" = --peers ]; then
  shift
  PG_BIN="$PG_BIN" exec python3 "$ROOT/benches/peers/run.py" "$@"
fi
command -v pgbench >/dev/null || [ -x "$PG_BIN/pgbench" ] || die "pgbench not found"
PG_BIN="$PG_BIN" exec python3 "$ROOT/benches/run.py" "$@"

#!/usr/bin/env bash
# The main job: the whole protocol, told as a story, against the real extension on a throwaway
# local cluster that this script starts and removes. Installs what is missing on a fresh machine.
# Usage: bash scripts/demo.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

setup_all
start_cluster
psql -X -q -c "CREATE EXTENSION pg_intent"
psql -X -q -f "$ROOT/demo/story.sql"
log "demo finished; the throwaway cluster is being removed"

#!/usr/bin/env bash
# The main job: the whole protocol, told as a story, against the real extension on a throwaway
# local cluster that this script starts and removes. Installs what is missing on a fresh machine.
# Usage: bash scripts/demo.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

setup_all
# Act 2 is a Rust program (the client, its contract-test harness, and local HTTP test
# providers): build it before the story starts, so that compiling does not interrupt it.
log "building the failover demo (harness/examples/failover_demo.rs)"
cargo build -q -p pg_intent_harness --example failover_demo
start_cluster
psql -X -q -c "CREATE EXTENSION pg_intent"
psql -X -q -f "$ROOT/demo/story.sql"
"$CARGO_TARGET_DIR/debug/examples/failover_demo"
psql -X -q -f "$ROOT/demo/failover.sql"
log "demo finished; the throwaway cluster is being removed"

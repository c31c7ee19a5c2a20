#!/usr/bin/env bash
# Benchmarks (targets from DESIGN.md; not part of scripts/test.sh):
#   convergence: time from a join/leave in one process until every sibling
#   socket of the key in another process carries its new share (kernel
#   SO_MAX_PACING_RATE read back), median / p99 over 1000 changes.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$TRAFFICRATE_ROOT"
trafficrate_install_packages
trafficrate_build build

echo "== convergence, changes back to back (coalescing worst case)"
build/convergence_bench --changes 1000 --gap-ms 0
echo "== convergence, changes 5 ms apart"
build/convergence_bench --changes 1000 --gap-ms 5

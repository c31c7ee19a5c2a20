#!/usr/bin/env bash
# Benchmarks (targets: docs/design.md, "Targets"; not part of scripts/test.sh):
#   writepath (issue 10, Overhead; tests/bench/write_path_bench.cc, Google
#   Benchmark from libbenchmark-dev): ns per write/send on a governed
#   loopback socket, raw against the Governor's fast path, a share change,
#   and the real interposer (LD_PRELOAD); table by bench/write_path.py.
#   cluster (issue 13, fleet sharing; tests/bench/cluster_bench.cc): two
#   hosts (two zones in one process, a ClusterAgent each) against a
#   redis-server the benchmark starts on 127.0.0.1, at 10 and at 10 000
#   active keys per host: Redis commands and bytes per second per host,
#   the agent threads' and redis-server's CPU, and the time from a join on
#   one host until the other host's share changes (100 joins, quick 20;
#   median, p99). Outside the namespace; its table, and raw figures in
#   bench/results/<date>-<commit>-cluster[-quick].json.
#   bench/budget.py (see bench/README.md), in a private network namespace
#   with lo at MTU 1500, with tcp_tso_rtt_log 9 and 0: convergence (join /
#   leave to every sibling, build/convergence_bench, 1000 changes),
#   keepalive (wrk req/s and one connection's B/s, library against none),
#   accuracy (nginx 2 and 4 workers, N = 1..64, 500k and 5m), short,
#   manyclients, slowreader, spread24, joinleave, scale (1k to 50k
#   connections over 4 workers, and 50k keys: delivered bytes, watcher CPU,
#   resident memory, join latency); trafficrate equal and budget side by
#   side with nginx limit_rate, limit_conn + limit_rate and trickle. One
#   table per setting, raw figures in bench/results/, and a Markdown report
#   with PNG plots beside them (bench/report.py).
#
#   scripts/bench.sh [--quick] [--only NAME[,NAME]] [--tso 9|0|both] [--shape on|off|both]
#                    [--tools LIST|none] [--serial] [--cases W:RATE:N[,...]]
#
#   --quick   fewer pairs, shorter windows (a few minutes; checks it works)
#   --only    e.g. --only convergence, --only writepath, --only cluster or
#             --only accuracy,short
#   --shape   the packet shaper (TRAFFICRATE_SHAPE): on (default), off, or both,
#             each its own tables, side by side in one run (both: twice the time)
#   --tools   the comparators (default all, see budget.py; none: the library only)
#   --serial  the tools of a case one after the other, not side by side
#   --cases   only these accuracy cases, e.g. 2:500k:4,4:5m:16 (workers:rate:N)
#   TRAFFICRATE_BUILD_DIR=DIR   measure that build (default build/). A DIR
#             that is already configured is rebuilt as configured (it may be
#             another checkout); otherwise it is configured from this tree.
# Needs root (packages, unshare). The quick run takes under 3 minutes on 2
# cores; the full one is meant to stay under 20, plus about 1.5 for cluster
# (see bench/README.md).
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$TRAFFICRATE_ROOT"

# The comment at the top, whatever its length.
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

only=""
quick=0
budget_args=()
while (($#)); do
  case $1 in
    --quick) quick=1; budget_args+=(--quick) ;;
    --only) only=${2:?--only needs a list}; shift ;;
    --only=*) only=${1#--only=} ;;
    --tso) budget_args+=(--tso "${2:?--tso needs 9, 0 or both}"); shift ;;
    --tso=*) budget_args+=("$1") ;;
    --shape) budget_args+=(--shape "${2:?--shape needs on, off or both}"); shift ;;
    --shape=*) budget_args+=("$1") ;;
    --tools) budget_args+=(--tools "${2:?--tools needs a list or none}"); shift ;;
    --tools=*) budget_args+=("$1") ;;
    --serial) budget_args+=(--serial) ;;
    --cases) budget_args+=(--cases "${2:?--cases needs W:RATE:N[,...]}"); shift ;;
    --cases=*) budget_args+=("$1") ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ -n $only ]] && budget_args+=(--only "$only")

# Is scenario $1 selected by --only (all are by default)?
selected() { [[ -z $only || ",$only," == *",$1,"* ]]; }
# Does --only select anything besides writepath and cluster (run here)?
budget_selected() { [[ -z $only ]] || [[ -n $(tr ',' '\n' <<<"$only" | grep -vx 'writepath\|cluster\|') ]]; }

# trickle: a comparator of the accuracy scenario (bench/README.md, Comparators);
# python3-matplotlib: bench/report.py's plots; libbenchmark-dev: writepath
# (only here: the normal build and scripts/test.sh do without); linux-perf:
# the watchers' time in interrupts (manyclients, scale), from tracepoints.
trafficrate_install_packages wrk trickle python3-matplotlib libbenchmark-dev linux-perf
if [[ -n ${TRAFFICRATE_BUILD_DIR:-} ]]; then
  build_dir=$(realpath -m "$TRAFFICRATE_BUILD_DIR")
  if [[ ! -f $build_dir/CMakeCache.txt ]]; then
    cmake -S "$TRAFFICRATE_ROOT" -B "$build_dir" -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  cmake --build "$build_dir"
else
  trafficrate_build build
  build_dir=$TRAFFICRATE_ROOT/build
fi
# A build dir configured before libbenchmark-dev was installed: configure
# again (find_package retries), so that write_path_bench is built.
if selected writepath && [[ ! -x $build_dir/write_path_bench ]]; then
  cmake "$build_dir" >/dev/null
  cmake --build "$build_dir"
fi
export TRAFFICRATE_BUILD_DIR=$build_dir
echo "== build: $build_dir"

status=0
# The write path's summary, handed to budget.py for the results and report.
wp_json=$(mktemp --tmpdir trafficrate-writepath.XXXXXX.json)
trap 'rm -f "$wp_json"' EXIT
# write_path_bench twice: in-process (raw, Governor fast path, share change),
# then under LD_PRELOAD (the real interposer); medians of repetitions run in
# random order, summarized against raw.
writepath() {
  local out reps=5 min_time=0.3 zone="wpb$$" rc=0
  ((quick)) && reps=3 min_time=0.1
  out=$(mktemp -d)
  local args=(--benchmark_repetitions=$reps --benchmark_min_time=$min_time
    --benchmark_enable_random_interleaving=true
    --benchmark_report_aggregates_only=true --benchmark_out_format=json)
  timeout 600 "$build_dir/write_path_bench" "${args[@]}" \
    --benchmark_out="$out/plain.json" >/dev/null || rc=$?
  if ((rc == 0)); then
    TRAFFICRATE_RATE=65536m TRAFFICRATE_ZONE=$zone \
      LD_PRELOAD=$build_dir/libtrafficrate.so \
      timeout 300 "$build_dir/write_path_bench" "${args[@]}" \
      --benchmark_out="$out/preloaded.json" >/dev/null || rc=$?
    "$build_dir/trafficrate" rm --force --zone "$zone" >/dev/null 2>&1 || true
  fi
  if ((rc == 0)); then
    /usr/bin/python3 "$TRAFFICRATE_ROOT/bench/write_path.py" --json "$wp_json" \
      "$out/plain.json" "$out/preloaded.json" || rc=$?
  fi
  rm -rf "$out"
  if ((rc != 0)); then
    : >"$wp_json"
    echo "bench.sh: write_path_bench failed (rc $rc)" >&2
    status=1
  fi
}
# run_selected NAME PROGRAM TITLE WHY: runs the function NAME when --only
# selects it, if build_dir holds PROGRAM; else says why it is missing.
run_selected() {
  selected "$1" || return 0
  if [[ -x $build_dir/$2 ]]; then
    echo "== $3"
    "$1"
  else
    echo "bench.sh: $2 not built ($4)" >&2
    status=1
  fi
}
run_selected writepath write_path_bench \
  "write path: ns per call on a governed loopback socket (medians of repetitions)" \
  "libbenchmark-dev missing?"

# cluster_bench: two hosts sharing through a redis-server of its own; it
# prints its table, and its figures and latency samples go to
# bench/results/<date>-<commit>-cluster[-quick][-N].json.
cluster() {
  local args=() commit stem json n=2 rc=0
  ((quick)) && args+=(--quick)
  commit=$(git -C "$TRAFFICRATE_ROOT" rev-parse --short HEAD 2>/dev/null || true)
  stem=$TRAFFICRATE_ROOT/bench/results/$(date +%F)-${commit:-nogit}-cluster
  ((quick)) && stem+=-quick
  json=$stem.json
  while [[ -e $json ]] && ((n < 1000)); do json=$stem-$((n++)).json; done
  mkdir -p "$(dirname "$json")"
  timeout 300 "$build_dir/cluster_bench" "${args[@]}" --json "$json" || rc=$?
  if ((rc != 0)); then
    echo "bench.sh: cluster_bench failed (rc $rc)" >&2
    status=1
  fi
  if [[ -s $json ]]; then echo "results: $json"; fi
}
run_selected cluster cluster_bench \
  "cluster: fleet sharing through Redis (tests/bench/cluster_bench.cc)" \
  "TRAFFICRATE_BENCHMARKS off?"

if budget_selected; then
  [[ -s $wp_json ]] && budget_args+=(--writepath "$wp_json")
  echo "== shared budget (bench/budget.py ${budget_args[*]})"
  # Everything of it in one private namespace: lo at MTU 1500, the sysctl
  # net.ipv4.tcp_tso_rtt_log changed there only.
  unshare -n sh -c 'ip link set lo up mtu 1500 && exec /usr/bin/python3 "$0" "$@"' \
    "$TRAFFICRATE_ROOT/bench/budget.py" "${budget_args[@]}" || status=$?
fi
exit $status

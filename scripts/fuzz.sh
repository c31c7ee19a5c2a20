#!/usr/bin/env bash
# Installs clang and libFuzzer if missing, builds the fuzz targets of
# tests/fuzz with clang (ASan + UBSan, build-fuzz/) and runs each for its
# share of the time: config_fuzz (every TRAFFICRATE_* parser) a sixth,
# zone_fuzz (zone attach, validation and the Locked API on any image) and
# snapshot_fuzz (what `trafficrate stat` and `top` read) a third each, and
# elf_probe_fuzz (the program inspector of run, check and the library) a
# sixth.
# Each starts from the committed seeds (tests/fuzz/seeds/<target>/) and from
# seeds made afresh for the current layout (make_fuzz_seeds), copied into a
# scratch corpus: nothing is written into the tree. The targets run side by
# side, one per core (the time is CPU time in all, the wall time less).
# Exits non-zero if any target crashes, hangs (-timeout) or runs out of
# memory; the input that did it is kept in build-fuzz/crashes/<target>/.
#
#   scripts/fuzz.sh                       30 s in all
#   scripts/fuzz.sh --seconds 3600        an hour
#   scripts/fuzz.sh --corpus DIR          keep and grow DIR/<target>/
#   scripts/fuzz.sh --only zone_fuzz      one target, all the time
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$TRAFFICRATE_ROOT"

seconds=30
corpus_root=""
only=""
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --corpus) corpus_root=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: scripts/fuzz.sh [--seconds N] [--corpus DIR] [--only TARGET]" >&2; exit 2 ;;
  esac
done
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 3)); then
  echo "fuzz.sh: --seconds takes a whole number, at least 3" >&2
  exit 2
fi

trafficrate_install_packages "${TRAFFICRATE_FUZZ_PACKAGES[@]}"

# target weight max_len: the zone targets' inputs are at most one zone
# (kFuzzZoneSize, tests/fuzz/fuzz_util.h).
targets=(
  "config_fuzz 1 4096"
  "zone_fuzz 2 65536"
  "snapshot_fuzz 2 65536"
  "elf_probe_fuzz 1 65536"
)
if [[ -n $only ]]; then
  for t in "${targets[@]}"; do
    [[ ${t%% *} == "$only" ]] && targets=("$t") && break
  done
  [[ ${targets[0]%% *} == "$only" ]] || { echo "fuzz.sh: no target $only" >&2; exit 2; }
fi
# Only what fuzzing runs: the targets and the seed maker (not the library,
# the CLI or the benchmarks, which the other builds cover).
build_targets=(make_fuzz_seeds)
for t in "${targets[@]}"; do build_targets+=("${t%% *}"); done
CC=clang CXX=clang++ cmake -S "$TRAFFICRATE_ROOT" -B "$TRAFFICRATE_ROOT/build-fuzz" \
  -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAFFICRATE_FUZZ=ON \
  -DTRAFFICRATE_BUILD_TESTS=OFF -DTRAFFICRATE_BENCHMARKS=OFF >/dev/null
cmake --build "$TRAFFICRATE_ROOT/build-fuzz" --target "${build_targets[@]}"

weights=0
for t in "${targets[@]}"; do
  read -r _ weight _ <<<"$t"
  weights=$((weights + weight))
done

scratch=$(mktemp -d /tmp/trafficrate-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
build-fuzz/make_fuzz_seeds "$scratch/seeds"
[[ -n $corpus_root ]] || corpus_root=$scratch/corpus
logs=build-fuzz/logs
mkdir -p "$logs"

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
failed=()
start=$(date +%s)
# The targets run at the same time, one per core at most: each runs for its
# share times targets / cores, so that it gets about its share of CPU time
# while they all run, in less wall time than one after the other.
cores=$(nproc 2>/dev/null || echo 1)
((cores < ${#targets[@]})) || cores=${#targets[@]}
pids=()
for t in "${targets[@]}"; do
  read -r name weight max_len <<<"$t"
  share=$((seconds * weight * ${#targets[@]} / weights / cores))
  ((share >= 1)) || share=1
  corpus=$corpus_root/$name
  crashes=build-fuzz/crashes/$name
  mkdir -p "$corpus" "$crashes"
  cp -n tests/fuzz/seeds/"$name"/* "$scratch/seeds/$name"/* "$corpus"/ 2>/dev/null || true
  echo "== $name: ${share} s, corpus $corpus, log $logs/$name.log"
  build-fuzz/"$name" -max_total_time="$share" -timeout=10 -rss_limit_mb=2048 \
    -max_len="$max_len" -print_final_stats=1 \
    -artifact_prefix="$crashes/" "$corpus" >"$logs/$name.log" 2>&1 &
  pids+=($!)
done
i=0
for t in "${targets[@]}"; do
  read -r name _ _ <<<"$t"
  crashes=build-fuzz/crashes/$name
  rc=0
  wait "${pids[i]}" || rc=$?
  i=$((i + 1))
  # "#N DONE cov: C ft: F corp: K/S ..." and the average speed.
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$logs/$name.log" | tail -1 || true)
  speed=$(sed -n 's/^stat::average_exec_per_sec:[[:space:]]*//p' "$logs/$name.log")
  echo "   $name: ${done_line:-no DONE line}; ${speed:-?} exec/s"
  if ((rc != 0)); then
    echo "!! $name failed (exit $rc); the input is in $crashes/:" >&2
    grep -E 'ERROR|runtime error|check failed|Test unit written|timeout' \
      "$logs/$name.log" | head -20 >&2 || true
    failed+=("$name")
  fi
done

echo "== fuzzing took $(($(date +%s) - start)) s"
if ((${#failed[@]})); then
  echo "!! failed: ${failed[*]} (reproduce: build-fuzz/TARGET INPUT)" >&2
  exit 1
fi

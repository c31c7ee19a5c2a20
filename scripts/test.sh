#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the unit tests
# (plain, under AddressSanitizer + UndefinedBehaviorSanitizer, and the shared
# zone, fd table and cluster agent tests under ThreadSanitizer), 30 s of fuzzing
# (scripts/fuzz.sh), then the integration tests against real servers in a
# private network namespace with a 1500-byte loopback, one of them with the
# ASan + UBSan build of the preload library, and the Debian package
# (scripts/package.sh), installed and used in a throwaway root. Exits non-zero
# if anything fails.
#
#   scripts/test.sh              everything
#   scripts/test.sh --quick      plain unit tests and integration tests only
#                                (no sanitizers, no fuzzing)
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$TRAFFICRATE_ROOT"

quick=0
[[ ${1:-} == --quick ]] && quick=1

start=$(date +%s)
# Each stage line says when it began (seconds since the start).
stage() { echo "== $* (at $(( $(date +%s) - start )) s)"; }
trafficrate_install_packages

stage "format (clang-format --dry-run -Werror)"
{ git ls-files '*.cc' '*.h' 2>/dev/null || true; } | xargs -r clang-format --dry-run -Werror

stage "include graph (layer order of src/, no cycle)"
/usr/bin/python3 scripts/check_includes.py "$TRAFFICRATE_ROOT"

stage "build"
trafficrate_build build -DTRAFFICRATE_WERROR=ON

stage "unit tests"
ctest --test-dir build --output-on-failure -j2

if ((!quick)); then
  # The sanitizer builds at -O1 -g1 (what the sanitizers' own docs advise;
  # a third less build time here than -O2 -g, stack traces keep their lines),
  # their test programs at -O0 (CMakeLists.txt: the core is what is checked).
  # No benchmarks there: nothing runs them under a sanitizer.
  sanitizer_flags=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                   -DTRAFFICRATE_BENCHMARKS=OFF)
  stage "unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
  trafficrate_build build-asan -DTRAFFICRATE_SANITIZE=address,undefined \
    "${sanitizer_flags[@]}"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j2

  stage "zone and its parts, fd table, local conns, governor, snapshot, cluster agent and listen watch tests under ThreadSanitizer"
  # Only the test programs that hold these suites, and only these suites of
  # them (GTEST_FILTER).
  tsan_tests=(zone zone_layout zone_segment robust_mutex change_word key_table
              conn_table handoff_table proc_table zone_settings zone_repair
              fd_table local_conns governor_accept governor_share
              governor_idle governor_fd governor_budget governor_after
              governor_inherited governor_live governor_pass governor_lock
              governor_fork snapshot cluster_agent bypass_watch)
  tsan_suites=(ZoneTest ZoneLayoutTest ZoneLockTest ZoneSegmentTest
               RobustMutexTest ChangeWordTest KeyTableTest ConnTableTest
               HandoffTableTest ProcTableTest ZoneSettingsTest ZoneRepairTest
               FdTableTest LocalConnsTest GovernorAcceptTest GovernorShareTest
               GovernorIdleTest GovernorRestTest GovernorFdTest
               GovernorBudgetTest GovernorAfterTest GovernorInheritedTest
               GovernorLiveTest GovernorPassTest GovernorLockTest
               GovernorForkTest SnapshotTest ClusterAgentTest BypassWatchTest)
  cmake -S "$TRAFFICRATE_ROOT" -B "$TRAFFICRATE_ROOT/build-tsan" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAFFICRATE_SANITIZE=thread \
    "${sanitizer_flags[@]}" >/dev/null
  cmake --build "$TRAFFICRATE_ROOT/build-tsan" \
    --target "${tsan_tests[@]/%/_test}"
  filter=$(printf '%s.*:' "${tsan_suites[@]}")
  TSAN_OPTIONS=halt_on_error=1 GTEST_FILTER=${filter%:} \
    ctest --test-dir build-tsan --output-on-failure -j2 \
    -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$"
fi

if ((!quick)); then
  stage "fuzz (30 s)"
  scripts/fuzz.sh --seconds 30
fi

stage "Debian package (scripts/package.sh; test_package.py installs it)"
scripts/package.sh
debs=("$TRAFFICRATE_ROOT"/build-pkg/trafficrate_*.deb)

stage "integration tests (private network namespace, lo mtu 1500)"
# test_asan_preload.py runs build-asan/libtrafficrate.so (built above) under a
# server. --quick builds no build-asan: the test is left out then, so that a
# build-asan left over from an earlier run is not tested in its place.
pytest_extra=()
if ((quick)); then
  echo "(test_asan_preload.py left out: --quick builds no build-asan)"
  pytest_extra=(--ignore=tests/integration/test_asan_preload.py)
fi
TRAFFICRATE_BUILD_DIR="$TRAFFICRATE_ROOT/build" TRAFFICRATE_DEB="${debs[0]}" \
  TRAFFICRATE_ASAN_BUILD_DIR="$TRAFFICRATE_ROOT/build-asan" unshare -n sh -c \
  'ip link set lo up mtu 1500 && exec /usr/bin/python3 -m pytest -v --durations=15 -p no:cacheprovider tests/integration "$@"' \
  sh "${pytest_extra[@]}"

echo "== all tests passed in $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# trafficrate demo: a real nginx (2 workers) under the library; 4 connections
# from client 127.0.0.2 and 1 from client 127.0.0.3 download at the same time,
# and each client IP gets TRAFFICRATE_RATE in total, however many connections
# it opens. Prints a live per-second table, then the averages and the target.
#
# Usage (as root, on Debian 12):
#   scripts/demo.sh [--rate 500k] [--duration 15] [--sendfile on|off] [--no-build]
#
# Installs missing build/test packages with apt-get, builds with CMake + Ninja
# into $TRAFFICRATE_BUILD_DIR (default <repo>/build), then runs everything in a
# private network namespace whose loopback has MTU 1500 (docs/design.md#loopback-mtu:
# on the host's 64 KiB-MTU loopback the kernel's unpaced first segments skew rates).
# nginx is stopped by pid, the zone (trafficrate rm) and the temp directory
# are removed when the demo ends, also on Ctrl-C.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TRAFFICRATE_BUILD_DIR="${TRAFFICRATE_BUILD_DIR:-$REPO/build}"
BUILD="$TRAFFICRATE_BUILD_DIR"
RATE=500k
DURATION=15
SENDFILE=on
DO_BUILD=1

usage() { sed -n '2,16s/^# \{0,1\}//p' "$0"; }
die() { echo "demo: $*" >&2; exit 1; }

while (($#)); do
  case "$1" in
    --rate) RATE="${2:?--rate needs a value}"; shift 2 ;;
    --duration) DURATION="${2:?--duration needs seconds}"; shift 2 ;;
    --sendfile) SENDFILE="${2:?--sendfile needs on or off}"; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
if ! [[ "$DURATION" =~ ^[0-9]+$ ]] || ((DURATION < 4 || DURATION > 50)); then
  die "--duration must be 4..50 seconds"
fi
[[ "$SENDFILE" == on || "$SENDFILE" == off ]] || die "--sendfile must be on or off"
((EUID == 0)) || die "run as root (it needs apt-get, unshare -n and nginx's user switch)"

source "$REPO/scripts/setup.sh"
trafficrate_install_packages
if ((DO_BUILD)); then
  echo "demo: building in $BUILD"
  cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD" --target trafficrate_preload trafficrate_ctl
fi
[[ -f "$BUILD/libtrafficrate.so" ]] || die "$BUILD/libtrafficrate.so not found (build failed?)"

ZONE="demo-$$"
cleanup() { "$BUILD/trafficrate" rm --force --zone "$ZONE" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "demo: TRAFFICRATE_RATE=$RATE, zone $ZONE, ${DURATION}s of downloads"
# unshare without --fork execs sh, which execs python: one process, which gets
# Ctrl-C itself and stops nginx (started in its own session) by pid.
unshare -n -- sh -c 'ip link set lo up mtu 1500 && exec "$@"' demo \
  /usr/bin/python3 "$REPO/tests/integration/harness.py" demo \
  --library "$BUILD/libtrafficrate.so" --zone "$ZONE" --rate "$RATE" \
  --duration "$DURATION" --sendfile "$SENDFILE" --workers 2 \
  --clients 127.0.0.2:4,127.0.0.3:1

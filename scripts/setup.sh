# Sourced by scripts/demo.sh, scripts/test.sh, scripts/bench.sh and
# scripts/fuzz.sh: installs what is missing on a fresh Debian 12 machine (as
# root) and builds.
#
#   source "$(dirname "$0")/setup.sh"
#   trafficrate_install_packages
#   trafficrate_build build            # -> build/libtrafficrate.so, build/trafficrate

TRAFFICRATE_PACKAGES=(
  cmake ninja-build g++ clang-format git
  libabsl-dev libgtest-dev googletest
  libhiredis-dev redis-server     # the Redis exchange and its tests (issue 13)
  python3 python3-pytest python3-prometheus-client
  nginx curl wrk openssl iproute2 util-linux procps
  caddy                           # a Go server (test_bypass.py: `run` says it is not paced)
  apache2 lighttpd aria2 nodejs   # the other real servers and client of test_servers.py
  systemd                         # systemd-socket-activate (test_inherited.py), systemd-analyze
  man-db                          # man -l, lexgrog (test_manual.py, test_package.py)
  vsftpd                          # test_vsftpd.py (issue 32: sessions made with a raw clone)
)
# Only for scripts/fuzz.sh: clang, and libFuzzer with the sanitizer runtimes
# (libclang_rt.fuzzer-x86_64.a is in libclang-rt-14-dev, which clang only
# recommends).
TRAFFICRATE_FUZZ_PACKAGES=(clang libclang-rt-14-dev)

trafficrate_install_packages() {
  local missing=() pkg
  for pkg in "${TRAFFICRATE_PACKAGES[@]}" "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  echo "trafficrate: installing ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then
    echo "trafficrate: run as root to install: ${missing[*]}" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || return 1
  # Installing nginx must not start (or leave running) the system's nginx.
  local policy_added=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    policy_added=1
  fi
  local rc=0
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
  if ((policy_added)); then rm -f /usr/sbin/policy-rc.d; fi
  return $rc
}

# trafficrate_build DIR [cmake options...]
trafficrate_build() {
  local dir=$1
  shift
  cmake -S "$TRAFFICRATE_ROOT" -B "$TRAFFICRATE_ROOT/$dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$TRAFFICRATE_ROOT/$dir"
}

TRAFFICRATE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

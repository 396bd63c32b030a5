#!/usr/bin/env bash
# Makes sure redis-server and redis-cli are installed for the tests of the Redis-backed storage
# level (tests/remote: tests/redis_servers.py starts its own servers on free ports). `make test`
# runs it. Idempotent, quiet, and it never leaves a Redis service running:
#   - both binaries on PATH or in /usr/bin: nothing to do;
#   - root with apt-get (Debian, Ubuntu): apt-get install redis-server (apt-get update first only
#     if that fails), with the service kept from starting (a policy-rc.d that denies, put there
#     for the install only, where there is none), and stopped and disabled if it started anyway;
#   - otherwise, or if the install fails: says how to install them and exits 0. The tests then
#     skip, naming it, unless STRATA_REQUIRE_REDIS=1 (.ci/run), where they fail.
set -euo pipefail

have_redis() {
  local b
  for b in redis-server redis-cli; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/bin/$b" ] || return 1
  done
}

how="install redis-server and redis-cli (Debian/Ubuntu: apt-get install redis-server;"
how="$how macOS: brew install redis); until then the Redis tests skip"

have_redis && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure_redis: redis-server not found: $how" >&2
  exit 0
fi

log=$(mktemp)
policy=/usr/sbin/policy-rc.d
own_policy=
cleanup() {
  if [ -n "$own_policy" ]; then rm -f "$policy"; fi
  rm -f "$log"
}
trap cleanup EXIT
if [ ! -e "$policy" ]; then
  # invoke-rc.d and deb-systemd-invoke ask it before starting a service: 101 = not allowed
  own_policy=1
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
fi

install_redis() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >>"$log" 2>&1
}
if ! install_redis; then
  apt-get update -q >>"$log" 2>&1 || true
  if ! install_redis; then
    tail -n 20 "$log" >&2
    echo "ensure_redis: apt-get install redis-server failed: $how" >&2
    exit 0
  fi
fi

# A service started anyway (a policy-rc.d that allows, a running systemd): stop it and keep it
# from starting at boot. Only the package's own server runs as the user redis; test servers run
# as whoever runs the tests.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now redis-server.service >/dev/null 2>&1 || true
fi
for pid in $(pgrep -u redis -x redis-server || true); do
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
done

if ! have_redis; then
  echo "ensure_redis: redis-server still not found after apt-get install: $how" >&2
fi
exit 0

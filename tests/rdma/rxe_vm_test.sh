#!/usr/bin/env bash
# tools/rxe-vm end to end: a guest with a soft-RoCE device boots from
# Debian's kernel, runs a command as this machine's root sees it, and hands
# back its exit code; in it, rxe0 is active, RC queue pairs move bytes
# (rdma-core's ibv_rc_pingpong: a real verbs data path), and kvrelay's own
# test binaries, built here, run unchanged.
#
#   rxe_vm_test.sh <project root> [<a kvrelay test binary>]
#
# (Without a binary, that last part is left out.)
#
# Exits 77 (ctest: skipped) saying why when the machine cannot run the VM
# (tools/setup.sh installs what it needs; CI always can).
set -euo pipefail
root=$1
test_binary=${2:-}
vm="$root/tools/rxe-vm"

"$(dirname "$0")/rxe_vm_available.sh" ibv_rc_pingpong ibv_devinfo || exit $?

failures=0
check() {
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}

set +e
"$vm" --timeout 240 sh -c 'exit 7'
rc=$?
set -e
check "the command's exit code comes back (7, got $rc)" test "$rc" -eq 7

out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
"$vm" --timeout 240 sh -c '
  ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE || { echo "rxe0 is not active"; exit 10; }
  timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 200 -s 65536 >/tmp/server.log 2>&1 &
  client=1
  for i in $(seq 1 20); do  # the server starts slowly under TCG: retry the connect
    sleep 1
    if timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 200 -s 65536 localhost; then client=0; break; fi
  done
  wait $! || { echo "pingpong server failed:"; cat /tmp/server.log; exit 11; }
  [ $client -eq 0 ] || exit 12
  echo "verbs: 200 RC round trips of 64 KiB each way"
  if [ -n "$1" ]; then
    "$1" --gtest_brief=1 --gtest_filter="SpscRing*:Barrier*" || exit 13
  fi
' rxe-check "$test_binary" | tee "$out"
rc=${PIPESTATUS[0]}
set -e
check "rxe0 active, RC traffic and kvrelay's binaries in the guest (exit $rc)" test "$rc" -eq 0
check "the pingpong reported its transfer" grep -q "bytes in" "$out"

[ "$failures" -eq 0 ]

#!/usr/bin/env bash
# Runs CMD in tools/rxe-vm (a guest with a soft-RoCE device) and exits with
# its exit code; exits 77 (ctest: skipped), saying why, where this machine
# cannot run the VM (tools/setup.sh installs what it needs; CI always can).
#
#   in_rxe_vm.sh <project root> <timeout seconds> CMD [ARG...]
set -euo pipefail
root=$1
timeout_s=$2
shift 2
"$(dirname "$0")/rxe_vm_available.sh" || exit $?
exec "$root/tools/rxe-vm" --timeout "$timeout_s" "$@"

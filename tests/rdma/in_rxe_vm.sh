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
for tool in qemu-system-x86_64 busybox rdma; do
  if ! command -v "$tool" >/dev/null; then
    echo "skipped: $tool is not installed (tools/setup.sh installs it)"
    exit 77
  fi
done
if ! apt-cache depends linux-image-amd64 >/dev/null 2>&1; then
  echo "skipped: apt knows no linux-image-amd64 to boot (run apt-get update)"
  exit 77
fi
exec "$root/tools/rxe-vm" --timeout "$timeout_s" "$@"

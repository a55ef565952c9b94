#!/usr/bin/env bash
# Whether this machine can run tools/rxe-vm: exits 0, or prints why not and
# exits 77 (ctest: skipped). tools/setup.sh installs what it needs; CI always
# can. Extra arguments name more commands the caller needs.
for tool in qemu-system-x86_64 busybox rdma "$@"; do
  if ! command -v "$tool" >/dev/null; then
    echo "skipped: $tool is not installed (tools/setup.sh installs it)"
    exit 77
  fi
done
if ! apt-cache depends linux-image-amd64 >/dev/null 2>&1; then
  echo "skipped: apt knows no linux-image-amd64 to boot (run apt-get update)"
  exit 77
fi

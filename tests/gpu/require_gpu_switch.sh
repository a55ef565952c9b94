#!/usr/bin/env bash
# KVRELAY_REQUIRE_GPU=1 (what tools/gpu-check sets) turns a GPU test's skip
# into a failure, so a device run in which nothing ran cannot look green.
# Here, without a usable GPU, gpu_tests must then fail, saying why; with
# one, the test simply runs.
#   require_gpu_switch.sh <gpu_tests>
set -uo pipefail
out=$(KVRELAY_REQUIRE_GPU=1 "$1" --gtest_filter='GpuSignals.*' 2>&1)
rc=$?
if grep -q "no usable GPU, but KVRELAY_REQUIRE_GPU=1 is set" <<<"$out"; then
  if [ "$rc" -ne 0 ]; then
    echo "without a usable GPU, KVRELAY_REQUIRE_GPU=1 made gpu_tests fail (exit $rc), as it must"
    exit 0
  fi
  echo "gpu_tests reported the missing GPU but exited 0"
  exit 1
fi
if [ "$rc" -eq 0 ] && grep -q '^\[  PASSED  \] 1 test' <<<"$out"; then
  echo "a GPU is usable here: the test ran and passed"
  exit 0
fi
echo "$out"
exit 1

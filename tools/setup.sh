#!/usr/bin/env bash
# Installs everything kvrelay needs to build, test and benchmark on Debian 12.
# Idempotent: when every package is already present it returns at once without
# touching apt. Run as root (or through sudo).
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang clang-tidy clang-format libclang-rt-14-dev
  # libraries (DESIGN.md section 2)
  libboost-dev capnproto libcapnp-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libibverbs-dev librdmacm-dev nlohmann-json3-dev libssl-dev
  # Python bindings and their tests
  python3 python3-dev pybind11-dev python3-pytest python3-numpy
  # pip install into a venv, and mypy on the installed stubs (install.pip_venv)
  python3-venv python3-pip python3-setuptools python3-wheel mypy
  # the example engine (examples/engine): PyTorch on the CPU, gloo for its
  # tensor-parallel all-reduce
  python3-torch
  # tools used by tests and benchmarks: setpriv (util-linux), procps, gnuplot for plots
  util-linux procps gnuplot-nox
  # the Debian packages: manual pages from --help, and lintian on the result
  help2man lintian
  # ip netns and veth pairs: the tcp transport's two-host tests; iperf3, the
  # tcp benchmark's second baseline (the path's own limit)
  iproute2 iperf3
  # the install tests: dpkg-shlibdeps for the .deb's Depends (dpkg-dev), curl
  # for the metrics endpoint, systemd-analyze for the units (systemd: only
  # the package, nothing is started)
  dpkg-dev curl systemd
  # tools/rxe-vm, the rdma tests' soft-RoCE guest (its kernel is fetched with
  # apt-get download, never installed): qemu under TCG, a static busybox for
  # the initramfs, rdma-core's verbs utilities (ibverbs-providers has rxe's
  # provider), and perftest (ib_write_bw: the rdma benchmark's baseline). Not the
  # rdma-core package: it pulls in systemd and udev.
  qemu-system-x86 busybox-static ibverbs-utils ibverbs-providers perftest
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

echo "setup: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"

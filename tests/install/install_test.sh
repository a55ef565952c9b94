#!/usr/bin/env bash
# kvrelay as an engine team gets it: installed into a fresh prefix
# (cmake --install), then used from outside the tree.
#   1. find_package(kvrelay CONFIG): the C++ engine test and the C ABI test,
#      built out of tree against the prefix, each run on a live instance that
#      the prefix's own kvrelay-coordinator starts;
#   2. pkg-config: the C ABI test built with `cc $(pkg-config ...)` alone;
#   3. Python: the installed module, imported from the prefix only, attaches
#      to a live instance;
#   4. nothing of the prefix misses a library (ldd), and libkvrelay.so exports
#      only the C ABI and kvrelay's public C++ classes.
#   install_test.sh <build dir> <tests dir> [python3]
set -euo pipefail
build=$(cd "$1" && pwd)
tests=$(cd "$2" && pwd)
python=${3:-python3}  # the interpreter the module was built for
work=$(mktemp -d /tmp/kvrelay-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

echo "== cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in bin/kvrelay-coordinator bin/kvrelay-worker bin/kvrelay-dump include/kvrelay.h \
         include/kvrelay/client.h lib/libkvrelay.so lib/cmake/kvrelay/kvrelayConfig.cmake \
         lib/pkgconfig/kvrelay.pc lib/systemd/system/kvrelay@.service; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
soname=$(objdump -p "$prefix/lib/libkvrelay.so" | awk '/SONAME/ { print $2 }')
[ "$soname" = libkvrelay.so.0 ] || { echo "FAIL: SONAME is '$soname', not libkvrelay.so.0"; exit 1; }
libraries=$(ldd "$prefix"/bin/* "$prefix/lib/libkvrelay.so") || true  # whole: see deb_test.sh
if grep -q "not found" <<<"$libraries"; then
  ldd "$prefix"/bin/* "$prefix/lib/libkvrelay.so" | grep "not found"
  echo "FAIL: a library is missing"; exit 1
fi
# Exactly the public API: no pimpl members (weak inline ones included), and
# no signature that names an internal type or a library kvrelay links in.
leaked=$( (nm -DC --defined-only "$prefix/lib/libkvrelay.so" | awk '$2 ~ /^[TWVBDR]$/' |
           grep -v -e ' kvrelay_' -e ' kvrelay::Client' -e ' kvrelay::PoolView' \
                   -e ' kvrelay::[a-z_]*_name(' -e 'typeinfo' -e ' KVRELAY_0$'
         nm -DC --defined-only "$prefix/lib/libkvrelay.so" |
           grep -e '::Impl' -e 'capnp' -e 'ControlSegment' -e 'Mpsc' -e 'spdlog' -e 'boost' \
                -e 'kj::' -e 'records::') || true)
[ -z "$leaked" ] || { echo "FAIL: libkvrelay.so exports more than its API:"; echo "$leaked" | head; exit 1; }

echo "== find_package(kvrelay CONFIG)"
cmake -S "$tests/install/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DKVRELAY_TESTS="$tests" -DCMAKE_BUILD_TYPE=Release > "$work/consumer.log"
grep "kvrelay 0" "$work/consumer.log"
cmake --build "$work/consumer" -j2 > "$work/consumer-build.log" ||
  { cat "$work/consumer-build.log"; exit 1; }
"$work/consumer/engine" "$prefix/bin/kvrelay-coordinator"
"$work/consumer/c_engine" "$prefix/bin/kvrelay-coordinator"

echo "== pkg-config"
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs kvrelay)
echo "pkg-config --cflags --libs kvrelay: $flags"
# shellcheck disable=SC2086
cc -std=c11 -o "$work/c_pkgconfig" "$tests/c_api/c_api_test.c" $flags -Wl,-rpath,"$prefix/lib"
"$work/c_pkgconfig" "$prefix/bin/kvrelay-coordinator"

echo "== python3: import kvrelay from the prefix"
site=$(ls -d "$prefix"/lib/python3*/dist-packages)
instance=install-py-$$
"$prefix/bin/kvrelay-coordinator" --instance "$instance" --role mixed --tp-size 1 --num-layers 2 \
  --num-blocks 16 --block-size 16 --head-dim 32 --log-level warn &
coordinator=$!
status=0
env -u PYTHONPATH PYTHONPATH="$site" "$python" - "$instance" "$site" <<'PY' || status=$?
import sys
import kvrelay
assert kvrelay.__file__.startswith(sys.argv[2]), f"imported {kvrelay.__file__}, not the installed module"
with kvrelay.Client(sys.argv[1], timeout=30) as c:
    assert c.tp_size == 1 and c.num_layers == 2, (c.tp_size, c.num_layers)
    print(f"python: {kvrelay.__file__} attached to {c.instance} (tp {c.tp_size})")
PY
kill -TERM "$coordinator"
wait "$coordinator" || { echo "FAIL: the coordinator did not exit 0 on SIGTERM"; exit 1; }
[ "$status" = 0 ] || { echo "FAIL: the installed Python module"; exit 1; }
echo "install: every consumer ran"

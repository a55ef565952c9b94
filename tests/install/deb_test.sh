#!/usr/bin/env bash
# The Debian package: `cpack -G DEB` of the build, then its contents and
# dependencies checked as a packager would, without installing it:
#   - dpkg-deb: its control fields (Depends filled in by dpkg-shlibdeps with
#     the libraries kvrelay links: Cap'n Proto, OpenSSL, ...) and its files;
#   - dpkg -x into a scratch root: every binary and library there finds its
#     libraries (ldd), and the systemd units name /usr/bin/kvrelay-coordinator;
#   - the packaged kvrelay-coordinator, run from the scratch root, starts an
#     instance and stops on SIGTERM with exit 0.
#   deb_test.sh <build dir>
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/kvrelay-deb-XXXXXX)
trap 'rm -rf "$work"' EXIT
(cd "$build" && cpack -G DEB -B "$work/out" > "$work/cpack.log" 2>&1) ||
  { tail -20 "$work/cpack.log"; echo "FAIL: cpack"; exit 1; }
deb=$(ls "$work"/out/kvrelay_*.deb)
echo "== $(basename "$deb")"
dpkg-deb -f "$deb" Package Version Architecture Depends
depends=$(dpkg-deb -f "$deb" Depends)
for lib in libcapnp libssl libc6 libstdc++6; do
  grep -q "$lib" <<<"$depends" || { echo "FAIL: Depends does not name $lib"; exit 1; }
done
dpkg-deb -c "$deb" > "$work/contents"
for f in ./usr/bin/kvrelay-coordinator ./usr/bin/kvrelay-worker ./usr/bin/kvrelay-dump \
         ./usr/include/kvrelay.h ./usr/include/kvrelay/client.h ./usr/lib/cmake/kvrelay/kvrelayConfig.cmake \
         ./usr/lib/pkgconfig/kvrelay.pc ./usr/lib/systemd/system/kvrelay.service \
         ./usr/lib/systemd/system/kvrelay@.service ./usr/share/doc/kvrelay/examples/kvrelay.env; do
  grep -q " $f\$" "$work/contents" || { echo "FAIL: the package has no $f"; exit 1; }
done
grep -q "./usr/lib/libkvrelay.so.0.1.0" "$work/contents" || { echo "FAIL: no libkvrelay.so.0.1.0"; exit 1; }
grep -q "./usr/lib/python3/dist-packages/kvrelay" "$work/contents" || { echo "FAIL: no Python module"; exit 1; }
dpkg -x "$deb" "$work/root"
if LD_LIBRARY_PATH="$work/root/usr/lib" ldd "$work"/root/usr/bin/* "$work/root/usr/lib/libkvrelay.so.0" |
   grep -q "not found"; then
  echo "FAIL: a packaged binary misses a library"; exit 1
fi
grep -q "^ExecStart=/usr/bin/kvrelay-coordinator " "$work/root/usr/lib/systemd/system/kvrelay@.service" ||
  { echo "FAIL: the unit does not run /usr/bin/kvrelay-coordinator"; exit 1; }
instance=deb-test-$$
"$work/root/usr/bin/kvrelay-coordinator" --instance "$instance" --role mixed --tp-size 1 \
  --num-layers 2 --num-blocks 16 --block-size 16 --head-dim 32 --log-level warn &
pid=$!
for _ in $(seq 100); do
  "$work/root/usr/bin/kvrelay-dump" "$instance" > /dev/null 2>&1 && break
  sleep 0.1
done
"$work/root/usr/bin/kvrelay-dump" "$instance" | head -1
kill -TERM "$pid"
wait "$pid" || { echo "FAIL: the packaged coordinator did not exit 0 on SIGTERM"; exit 1; }
echo "deb: contents, dependencies and the packaged binaries check out"

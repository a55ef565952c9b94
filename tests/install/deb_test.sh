#!/usr/bin/env bash
# The Debian packages: `cpack -G DEB` of the build (kvrelay, libkvrelay0,
# libkvrelay-dev, python3-kvrelay and their -dbgsym), then checked as a
# packager would, without installing them:
#   - lintian: no error and no warning (tools/package/*.lintian-overrides
#     says why for the few it overrides);
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
for p in kvrelay libkvrelay0 libkvrelay-dev python3-kvrelay; do
  [ -e "$(ls "$work"/out/${p}_*.deb 2>/dev/null | head -1)" ] || { echo "FAIL: no package $p"; ls "$work/out"; exit 1; }
done
ls "$work"/out/*-dbgsym_*.ddeb > /dev/null || { echo "FAIL: no -dbgsym packages"; exit 1; }
if command -v lintian > /dev/null; then
  lintian --tag-display-limit 0 "$work"/out/*.deb > "$work/lintian.log" 2>&1 || true
  grep -v "running with root privileges" "$work/lintian.log" || true
  ! grep -q "^[EW]: " "$work/lintian.log" || { echo "FAIL: lintian has errors or warnings"; exit 1; }
  echo "lintian: no errors or warnings"
else
  echo "(lintian not installed: tools/setup.sh installs it)"
fi
depends=""
: > "$work/contents"
for deb in "$work"/out/*.deb; do
  echo "== $(basename "$deb")"
  dpkg-deb -f "$deb" Package Version Architecture Depends
  depends+=" $(dpkg-deb -f "$deb" Depends)"
  dpkg-deb -c "$deb" >> "$work/contents"
  dpkg -x "$deb" "$work/root"
  # Listings are read whole before grep -q, which stops at its first match:
  # a writer still writing into its pipe then dies of SIGPIPE, and under
  # pipefail that failed the check once although the file was there.
  listing=$(dpkg-deb -c "$deb")
  grep -q " ./usr/share/doc/$(dpkg-deb -f "$deb" Package)/copyright\$" <<<"$listing" ||
    { echo "FAIL: $(basename "$deb") has no copyright file"; exit 1; }
done
for lib in libcapnp libssl libc6 libstdc++6; do
  grep -q "$lib" <<<"$depends" || { echo "FAIL: Depends does not name $lib"; exit 1; }
done
grep -q "libkvrelay0 (= " <(dpkg-deb -f "$work"/out/libkvrelay-dev_*.deb Depends) ||
  { echo "FAIL: libkvrelay-dev does not depend on its libkvrelay0"; exit 1; }
control_files=$(dpkg-deb --ctrl-tarfile "$work"/out/libkvrelay0_*.deb | tar -tf -)
grep -q "shlibs" <<<"$control_files" ||
  { echo "FAIL: libkvrelay0 has no shlibs file"; exit 1; }
if command -v file > /dev/null && file "$work/root/usr/bin/kvrelay-coordinator" | grep -q "not stripped"; then
  echo "FAIL: kvrelay-coordinator is not stripped (its debug info belongs in kvrelay-dbgsym)"; exit 1
fi
for f in ./usr/bin/kvrelay-coordinator ./usr/bin/kvrelay-worker ./usr/bin/kvrelay-dump \
         ./usr/include/kvrelay.h ./usr/include/kvrelay/client.h ./usr/lib/cmake/kvrelay/kvrelayConfig.cmake \
         ./usr/lib/pkgconfig/kvrelay.pc ./usr/lib/systemd/system/kvrelay.service \
         ./usr/lib/systemd/system/kvrelay@.service ./usr/share/doc/kvrelay/examples/kvrelay.env \
         ./usr/share/man/man1/kvrelay-coordinator.1.gz; do
  grep -q " $f\$" "$work/contents" || { echo "FAIL: the package has no $f"; exit 1; }
done
grep -q "./usr/lib/libkvrelay.so.0.1.0" "$work/contents" || { echo "FAIL: no libkvrelay.so.0.1.0"; exit 1; }
grep -q "./usr/lib/python3/dist-packages/kvrelay" "$work/contents" || { echo "FAIL: no Python module"; exit 1; }
libraries=$(LD_LIBRARY_PATH="$work/root/usr/lib" ldd "$work"/root/usr/bin/* \
  "$work/root/usr/lib/libkvrelay.so.0")
if grep -q "not found" <<<"$libraries"; then
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

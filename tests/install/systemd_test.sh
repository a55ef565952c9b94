#!/usr/bin/env bash
# The installed systemd units, checked with `systemd-analyze verify` (exit 77,
# skipped, where this machine has no systemd-analyze): installed into a
# scratch prefix so that their ExecStart names a binary that exists, with
# the example environment file where the units read it.
#   systemd_test.sh <build dir>
set -euo pipefail
build=$(cd "$1" && pwd)
if ! command -v systemd-analyze > /dev/null; then
  echo "systemd: skipped: systemd-analyze is not installed here (Debian's systemd package has it)"
  exit 77
fi
work=$(mktemp -d /tmp/kvrelay-units-XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > /dev/null
units=$work/prefix/lib/systemd/system
# A copy of the template as an instance, as systemctl would run it.
cp "$units/kvrelay@.service" "$work/kvrelay@prefill0.service"
status=0
for u in "$units/kvrelay.service" "$work/kvrelay@prefill0.service"; do
  out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$u" 2>&1) || status=1
  # Complaints about other units of this machine are not ours.
  mine=$(grep -e "$(basename "$u")" <<<"$out" || true)
  if [ -n "$mine" ]; then
    echo "$mine"
    status=1
  fi
done
[ "$status" = 0 ] || { echo "FAIL: systemd-analyze verify"; exit 1; }
grep -q "^KillMode=mixed" "$units/kvrelay@.service"
grep -q "^KillSignal=SIGTERM" "$units/kvrelay@.service"
for u in "$units/kvrelay.service" "$units/kvrelay@.service"; do
  # Ready when it serves, no restart loop on a configuration error, logs on disk.
  grep -q "^Type=notify" "$u"
  grep -q "^RestartPreventExitStatus=2" "$u"
  grep -q "^LogsDirectory=kvrelay" "$u"
  grep -q -- "--log-dir \${LOGS_DIRECTORY}" "$u"
done
echo "systemd: both units verify"

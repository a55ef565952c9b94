#!/usr/bin/env bash
# Every kvrelay program keeps the command-line conventions scripts and units
# rely on (shm/command_line.h): `--version` prints "<program> <version>" and
# exits 0, `--help` exits 0, and a usage error exits 2 saying why.
#   conventions.sh <version> <program>...
set -uo pipefail
version=$1
shift
bad=0
for program in "$@"; do
  name=$(basename "$program")
  out=$("$program" --version 2>&1); code=$?
  if [ $code -ne 0 ] || [ "$out" != "$name $version" ]; then
    echo "FAIL: $name --version exited $code and printed '$out' (want '$name $version', 0)"
    bad=1
  fi
  "$program" --help > /dev/null 2>&1; code=$?
  if [ $code -ne 0 ]; then echo "FAIL: $name --help exited $code"; bad=1; fi
  out=$("$program" --no-such-flag 2>&1); code=$?
  if [ $code -ne 2 ] || [ -z "$out" ]; then
    echo "FAIL: $name --no-such-flag exited $code (want 2, with a reason): $out"
    bad=1
  fi
done
[ $bad -eq 0 ] && echo "cli: $# programs keep --version, --help and exit 2 on a usage error"
exit $bad

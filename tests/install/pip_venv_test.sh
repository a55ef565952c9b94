#!/usr/bin/env bash
# The Python module built for the interpreter an engine runs in: a venv
# (python3 -m venv --system-site-packages), `pip install --no-build-isolation`
# of a copy of the source tree. The installed module must import from the
# venv, work, and carry its stubs where mypy finds them (PEP 561: the
# kvrelay-stubs package), so that a wrong call is a type error.
#   pip_venv_test.sh <source dir>
# Exits 77 (skipped) without python3-venv, pip or mypy (tools/setup.sh
# installs them).
set -euo pipefail
src=$1
python=/usr/bin/python3
for m in venv pip mypy; do
  "$python" -c "import $m" 2>/dev/null || { echo "skipped: no python3 module $m"; exit 77; }
done
work=$(mktemp -d /tmp/kvrelay-pip.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
tar -C "$src" --exclude=./build --exclude=./.git -cf - . | tar -C "$work/src" -xf -
"$python" -m venv --system-site-packages "$work/venv"
# CUDA and RDMA off: the module's build, not the toolkits', is under test.
KVRELAY_CMAKE_ARGS="-DKVRELAY_CUDA=OFF -DKVRELAY_RDMA=OFF" \
  "$work/venv/bin/python" -m pip install -q --no-build-isolation "$work/src" > "$work/pip.log" 2>&1 ||
  { cat "$work/pip.log"; echo "FAIL: pip install"; exit 1; }
cd "$work"
"$work/venv/bin/python" - "$work/venv" <<'PY'
import sys
import kvrelay
assert kvrelay.__file__.startswith(sys.argv[1]), kvrelay.__file__
assert kvrelay.__version__, "no version"
assert kvrelay.Client.request_tag("a") == kvrelay.Client.request_tag("a") != 0
try:
    kvrelay.Client("no-such-kvrelay-instance", timeout=0.2)
except kvrelay.NotFound as e:
    print("a missing instance:", e)
else:
    raise AssertionError("attached to an instance that does not exist")
print("kvrelay", kvrelay.__version__, "from", kvrelay.__file__)
PY
cat > "$work/typed.py" <<'PY'
import kvrelay
client = kvrelay.Client("x")
tp: int = client.tp_size
client.submit_cache_task("r", [1, 2], "not a token count")
PY
out=$("$work/venv/bin/python" -m mypy --no-incremental "$work/typed.py" 2>&1 || true)
echo "$out"
grep -q 'Argument 3 to "submit_cache_task" of "Client" has incompatible type "str"; expected "int"' <<<"$out" ||
  { echo "FAIL: mypy did not check the call against the installed stubs"; exit 1; }
echo "ok: built for the venv's python, imported from it, typed for mypy"

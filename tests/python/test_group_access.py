"""--group-access as a unit runs it: the coordinator (and its workers) as a
service user with the unit's Group=, the engine as another uid that is in
that group. The engine must attach, submit and get its completion; the same
uid without the group must be refused with PermissionDenied, naming the
segment. setpriv (util-linux) stands in for systemd's User=/Group=."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN_DIR

SERVICE_UID, ENGINE_UID, GROUP = 64998, 64997, 64999

ENGINE = """
import sys, kvrelay
try:
    c = kvrelay.Client(sys.argv[1], timeout=10)
except kvrelay.PermissionDenied as e:
    print("denied:", e); sys.exit(3)
c.submit_swap("group-swap", "evict", [1], [1])
done = c.wait(timeout=20)
print(done.status, done.message)
sys.exit(0 if done.ok else 1)
"""


def reachable_by_others(path: Path) -> bool:
    """Whether another uid can reach `path` (every folder above it o+x)."""
    for p in [path, *path.parents]:
        if not os.stat(p).st_mode & stat.S_IXOTH:
            return False
    return True


def module_dir() -> Path:
    import kvrelay
    return Path(kvrelay.__file__).resolve().parent


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv (util-linux) to run as other uids")
def test_an_engine_of_another_uid_in_the_units_group_uses_the_instance():
    if not (reachable_by_others(BIN_DIR.resolve()) and reachable_by_others(module_dir())):
        pytest.skip("the build is not reachable by other uids (a folder above it is not o+x)")
    instance = f"group-{os.getpid()}"
    service = ["setpriv", f"--reuid={SERVICE_UID}", f"--regid={GROUP}", "--clear-groups"]
    coordinator = subprocess.Popen(
        [*service, str(BIN_DIR / "kvrelay-coordinator"), "--instance", instance, "--role",
         "mixed", "--tp-size", "1", "--num-layers", "2", "--num-blocks", "16", "--block-size",
         "16", "--head-dim", "32", "--num-host-blocks", "8", "--group-access", "--log-level",
         "warn"])
    try:
        control = Path(f"/dev/shm/kvrelay-{instance}")
        deadline = time.monotonic() + 20
        while not control.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        st = os.stat(control)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (SERVICE_UID, GROUP, 0o660)
        env = dict(os.environ, PYTHONPATH=str(module_dir()))
        in_group = subprocess.run(
            ["setpriv", f"--reuid={ENGINE_UID}", f"--regid={ENGINE_UID}", f"--groups={GROUP}",
             sys.executable, "-c", ENGINE, instance],
            capture_output=True, text=True, timeout=60, env=env)
        assert in_group.returncode == 0, in_group.stdout + in_group.stderr
        assert in_group.stdout.startswith("finished"), in_group.stdout
        outside = subprocess.run(
            ["setpriv", f"--reuid={ENGINE_UID}", f"--regid={ENGINE_UID}", "--clear-groups",
             sys.executable, "-c", ENGINE, instance],
            capture_output=True, text=True, timeout=60, env=env)
        assert outside.returncode == 3, outside.stdout + outside.stderr
        assert f"kvrelay-{instance}" in outside.stdout, outside.stdout
    finally:
        coordinator.terminate()
        assert coordinator.wait(timeout=30) == 0
    assert not Path(f"/dev/shm/kvrelay-{instance}").exists()

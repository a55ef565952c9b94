"""Two hosts on one machine (--two-hosts): the prefill side in one network
namespace and the decode side in another, joined by a veth pair with
addresses from the benchmarking range 198.18.0.0/15. Each instance and its
engine's rank processes live in their own namespace, as on two servers: they
share /dev/shm with nothing across the pair (kvrelay's fd socket is
per-namespace), and the KV cache crosses the veth over tcp.

Needs root (CAP_SYS_ADMIN) and iproute2's `ip`.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess

CLONE_NEWNET = 0x40000000
PREFILL_ADDRESS = "198.18.214.1"
DECODE_ADDRESS = "198.18.214.2"


def unavailable() -> str:
    """Why two namespaces cannot be made here, or ''."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN"
    return ""


def _ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {p.stderr.strip()}")


class TwoHosts:
    """Namespaces `prefill` and `decode`, made on entry, deleted on exit
    (deleting a namespace deletes its end of the pair, and so the pair)."""

    def __init__(self, tag: str) -> None:
        tag = tag[-8:]
        self.prefill, self.decode = f"kvr-{tag}-p", f"kvr-{tag}-d"
        self._veth = (f"kv{tag}p", f"kv{tag}d")  # interface names: at most 15 characters

    def __enter__(self) -> "TwoHosts":
        try:
            _ip("netns", "add", self.prefill)
            _ip("netns", "add", self.decode)
            a, b = self._veth
            _ip("link", "add", a, "type", "veth", "peer", "name", b)
            for ns, dev, address in ((self.prefill, a, PREFILL_ADDRESS),
                                     (self.decode, b, DECODE_ADDRESS)):
                _ip("link", "set", dev, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", dev, "up")
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in (self.prefill, self.decode):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def decode_received_bytes(self) -> int:
        """What the decode side's end of the pair has received: the KV cache
        (and the handshakes, acks' peers, headers) that crossed it."""
        p = subprocess.run(["ip", "-n", self.decode, "-j", "-s", "link", "show", "dev",
                            self._veth[1]], capture_output=True, text=True, check=True)
        return int(json.loads(p.stdout)[0]["stats64"]["rx"]["bytes"])

    @staticmethod
    def exec_prefix(ns: str) -> list[str]:
        """A command line's prefix that runs it in namespace `ns` ('' : here)."""
        return ["ip", "netns", "exec", ns] if ns else []


def enter(ns: str) -> None:
    """This process into network namespace `ns` ('' : stay), before it
    starts anything that uses the network or kvrelay."""
    if not ns:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in(ns: str, target, *args) -> None:
    """A rank process's entry: into `ns`, then `target(*args)`."""
    enter(ns)
    target(*args)

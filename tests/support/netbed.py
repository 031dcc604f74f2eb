"""A test bed of real networks: each server in its own network namespace (issue 41).

Every fault test so far put all servers on 127.0.0.1, and a "cut link" was a
command the broker obeyed. Here each server gets a namespace of its own with one
address on a bridge, and the network itself misbehaves:

- the bridge lives in the test's own namespace, with the gateway address
  (``.1``): clients run in the test process and reach every server;
- server ``i`` is ``10.213.N.(10+i)``, in namespace ``<tag>n<i>``, its end of a
  veth pair on the bridge;
- **silent drops**: in each namespace a second veth pair leads nowhere (ARP off,
  so nothing answers and nothing is refused). A cut routes a peer's address
  into it: what the server sends there vanishes, SYNs go unanswered, an
  established connection is left half-open. A ``blackhole`` route would not
  do: the kernel answers the sender with EINVAL at once, which no real network
  does;
- ``cut(i, j)`` drops what ``i`` sends to ``j``: one direction at the IP level. No
  new TCP connection forms either way (``i``'s SYN or SYN-ACK is lost), but on a
  connection already open ``j``'s data still reaches ``i`` (unacknowledged)
  while ``i``'s never reaches ``j``: ``i`` hears ``j``, ``j`` does not hear ``i``;
  ``cut_both``,
  ``isolate`` (from every other server; clients still reach it: a client on the
  far side of a partition), ``partition`` (groups that do not hear each other),
  ``unplug`` (its interface down: clients lose it too), ``heal``.

Everything is torn down at the end (processes in the namespaces, namespaces,
links, the bridge), also after a failure; ``sweep_stale`` removes what a killed
test run left. Without root or ``ip netns`` the bed cannot be made:
``unavailable()`` says why, for a clear skip.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

#: the bed's addresses: 10.213.N.0/24, N chosen free at setup
NET_PREFIX = "10.213"
#: names start with this, then the test process's pid, then a counter
TAG = "rk"
_counter = itertools.count()
_open: list[NetBed] = []
_unavailable: str | bool | None = False  # False: not checked yet


class NetBedError(RuntimeError):
    """An ``ip`` command failed; the message has its stderr."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise NetBedError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can): not root, no ``ip``, or
    the kernel refuses (a container without CAP_NET_ADMIN)."""
    global _unavailable
    if _unavailable is not False:
        return _unavailable  # type: ignore[return-value]
    reason: str | None = None
    if os.geteuid() != 0:
        reason = "network namespaces need root (CI runs as root)"
    elif shutil.which("ip") is None:
        reason = "no 'ip' command (Debian's iproute2)"
    else:
        probe = f"{TAG}probe{os.getpid()}"
        made = ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            reason = f"cannot make a network namespace: {made.stderr.strip()}"
        else:
            ip("netns", "del", probe, check=False)
    _unavailable = reason
    return reason


def sweep_stale() -> list[str]:
    """Namespaces and links of beds whose test process is gone (a run killed with -9):
    removed; their names returned."""
    removed = []
    pattern = re.compile(rf"^{TAG}(\d+)x\d+")
    names = ip("netns", "list", check=False).stdout.split()
    links = re.findall(r"^\d+: ([^:@]+)", ip("-o", "link", "show", check=False).stdout, re.M)
    for name in [*names, *links]:
        match = pattern.match(name)
        if match is None or _alive(int(match[1])):
            continue
        if name in names:
            _kill_inside(name)
            ip("netns", "del", name, check=False)
        else:
            ip("link", "del", name, check=False)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(namespace: str) -> None:
    """Every process in ``namespace``: SIGKILL (a bed is torn down after its test)."""
    pids = ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _free_subnet() -> int:
    used = set(re.findall(rf"{re.escape(NET_PREFIX)}\.(\d+)\.", ip("-4", "addr").stdout))
    for third in range(1, 255):
        if str(third) not in used:
            return third
    raise NetBedError(f"no free {NET_PREFIX}.N.0/24 subnet")


@dataclass
class NetBed:
    """``size`` namespaces on one bridge. Use as a context manager (``with NetBed(3)``)."""

    size: int
    tag: str = field(default_factory=lambda: f"{TAG}{os.getpid()}x{next(_counter)}")
    subnet: int = 0
    #: (from, to) pairs whose traffic is dropped now
    cuts: set[tuple[int, int]] = field(default_factory=set)
    unplugged: set[int] = field(default_factory=set)
    _made: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.size <= 200:
            raise ValueError("a bed has 1 to 200 servers")
        if len(self.tag) > 10:
            raise ValueError(f"tag {self.tag!r} too long for interface names")

    # -- names ----------------------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"{self.tag}b"

    def namespace(self, index: int) -> str:
        return f"{self.tag}n{index}"

    def _veth(self, index: int) -> str:
        return f"{self.tag}v{index}"

    @property
    def gateway(self) -> str:
        """The test's own address on the bridge (where clients come from)."""
        return f"{NET_PREFIX}.{self.subnet}.1"

    def address(self, index: int) -> str:
        return f"{NET_PREFIX}.{self.subnet}.{10 + index}"

    def wrap(self, index: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside server ``index``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(index), *argv]

    # -- making and unmaking ------------------------------------------------------

    def __enter__(self) -> NetBed:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        reason = unavailable()
        if reason is not None:
            raise NetBedError(reason)
        sweep_stale()
        self.subnet = _free_subnet()
        _open.append(self)
        self._made = True
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for index in range(self.size):
                self._add(index)
        except Exception:
            self.close()
            raise

    def _add(self, index: int) -> None:
        ns, veth = self.namespace(index), self._veth(index)
        ip("netns", "add", ns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", veth, "master", self.bridge, "up")
        ip("-n", ns, "addr", "add", f"{self.address(index)}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        # the drop: a veth pair that leads nowhere, ARP off so nothing ever answers
        ip("-n", ns, "link", "add", "drop0", "type", "veth", "peer", "name", "drop1")
        ip("-n", ns, "link", "set", "drop0", "arp", "off")
        ip("-n", ns, "link", "set", "drop0", "up")
        ip("-n", ns, "link", "set", "drop1", "up")

    def close(self) -> None:
        """Kill what runs in the namespaces, then remove them, the links and the bridge."""
        if not self._made:
            return
        self._made = False
        for index in range(self.size):
            _kill_inside(self.namespace(index))
        for index in range(self.size):
            ip("netns", "del", self.namespace(index), check=False)
            ip("link", "del", self._veth(index), check=False)
        ip("link", "del", self.bridge, check=False)
        with contextlib.suppress(ValueError):
            _open.remove(self)

    # -- faults ---------------------------------------------------------------------

    def cut(self, source: int, target: int) -> None:
        """What ``source`` sends to ``target`` is dropped, silently."""
        if source == target or (source, target) in self.cuts:
            return
        ip(
            "-n",
            self.namespace(source),
            "route",
            "add",
            f"{self.address(target)}/32",
            "dev",
            "drop0",
        )
        self.cuts.add((source, target))

    def cut_both(self, a: int, b: int) -> None:
        self.cut(a, b)
        self.cut(b, a)

    def isolate(self, index: int) -> None:
        """Cut off from every other server, both ways; clients still reach it."""
        for other in range(self.size):
            if other != index:
                self.cut_both(index, other)

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Servers in different groups do not hear each other (both ways)."""
        for a, b in itertools.combinations(range(len(groups)), 2):
            for i in groups[a]:
                for j in groups[b]:
                    self.cut_both(i, j)

    def unplug(self, index: int) -> None:
        """Its interface down: no server and no client reaches it, nor it them."""
        ip("-n", self.namespace(index), "link", "set", "eth0", "down")
        self.unplugged.add(index)

    def heal(self) -> None:
        """Every cut undone and every interface up (routes back as at the start)."""
        for source, target in sorted(self.cuts):
            ip(
                "-n",
                self.namespace(source),
                "route",
                "del",
                f"{self.address(target)}/32",
                "dev",
                "drop0",
                check=False,
            )
        self.cuts.clear()
        for index in sorted(self.unplugged):
            ip("-n", self.namespace(index), "link", "set", "eth0", "up")
            # the subnet route goes with the link: back with it
            ip(
                "-n",
                self.namespace(index),
                "route",
                "replace",
                f"{NET_PREFIX}.{self.subnet}.0/24",
                "dev",
                "eth0",
                check=False,
            )
        self.unplugged.clear()

    def reachable(self, source: int, target: int) -> bool:
        """Does ``source``'s routing send to ``target`` (not cut, both plugged in)?"""
        return (
            (source, target) not in self.cuts
            and source not in self.unplugged
            and target not in self.unplugged
        )


@contextlib.contextmanager
def netbed(size: int) -> Iterator[NetBed]:
    bed = NetBed(size)
    with bed:
        yield bed


def wait_for(check: object, timeout: float, what: str) -> None:
    """Poll ``check()`` until true (network changes take effect at once, but tests
    read effects through processes)."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout}s")
        time.sleep(0.05)


@atexit.register
def _close_all() -> None:
    for bed in list(_open):
        bed.close()

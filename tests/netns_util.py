"""Engine "hosts" for multi-host tests: one network namespace each, joined to the root
namespace by a veth pair, so a test can take a host off the network with `ip link set down`
the way a failed switch port or a dead node does (no TCP reset, just silence).

Needs root and iproute2; `netns_unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def netns_unavailable() -> str | None:
    """None when `ip netns` works here, else the reason it does not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"phprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except subprocess.CalledProcessError as e:
        return f"`ip netns add` failed: {e.stderr.strip()}"
    return None


FALLBACK_METRIC = "4000"  # above the connected route's 0: used only while the link is down


@dataclass(frozen=True)
class Host:
    """A namespace `ns` reachable from the root namespace at `addr` over `root_if`."""

    ns: str
    root_if: str  # the root namespace's end of the veth pair; down = host cut off
    addr: str
    subnet: str  # its /24, with a fallback route while the link is down

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]

    def cut(self) -> None:
        _ip("link", "set", self.root_if, "down")

    def restore(self) -> None:
        _ip("link", "set", self.root_if, "up")

    def remove(self) -> None:
        # Deleting the namespace also deletes both ends of its veth pair, not the route.
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "route", "del", "unreachable", self.subnet,
                        "metric", FALLBACK_METRIC], capture_output=True)


def make_host(tag: str, index: int) -> Host:
    """Host `index` (1..250) on its own /24: root side .1, namespace side .2. `tag` keeps
    interface names (15 chars at most) unique per test run."""
    ns, root_if, inner_if = f"ph{tag}-{index}", f"ph{tag}r{index}", f"ph{tag}n{index}"
    subnet = f"10.231.{index}"
    host = Host(ns, root_if, f"{subnet}.2", f"{subnet}.0/24")
    try:
        # While the link is down its connected route is gone; without this one, packets for
        # the host would follow the default route, and whatever answers there (in a sandbox,
        # an egress proxy's HTTP 404) would stand in for the engine. With it: no route to host.
        _ip("route", "add", "unreachable", host.subnet, "metric", FALLBACK_METRIC)
        _ip("netns", "add", ns)
        _ip("link", "add", root_if, "type", "veth", "peer", "name", inner_if)
        _ip("link", "set", inner_if, "netns", ns)
        _ip("addr", "add", f"{subnet}.1/24", "dev", root_if)
        _ip("link", "set", root_if, "up")
        # vLLM's API server reaches its engine core over loopback: lo must be up too.
        for args in (("addr", "add", f"{subnet}.2/24", "dev", inner_if),
                     ("link", "set", inner_if, "up"), ("link", "set", "lo", "up")):
            _ip("-n", ns, *args)
    except BaseException:
        host.remove()
        subprocess.run(["ip", "link", "del", root_if], capture_output=True)
        raise
    return host

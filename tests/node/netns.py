"""The real node's network: a namespace of the fixture's own, joined to the host by one veth pair.

Inside: loopback, `eth0` holding the node's IP, and the CNI bridge its Pods join. Its only routes
are the veth's /30 and the Pods' subnet: no default route, so a process on the node that tries to
reach any other address fails at once ("network is unreachable") instead of leaving the machine.
The host side of the veth carries the one address the node may dial, where the fixture relays
the apiserver.
"""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass

# A /30 of the fixture's own for the veth, and the Pods' subnet behind the node's bridge; both live
# only between the host side of the veth and the namespace.
HOST_ADDRESS = "10.201.0.1"
NODE_ADDRESS = "10.201.0.2"
VETH_PREFIX = 30
POD_SUBNET = "10.202.0.0/24"


def _ip(*args: str, netns: str | None = None) -> str:
    command = ["ip", *(("-n", netns) if netns else ()), *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class NodeNetwork:
    name: str
    host_veth: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def enter(self, command: list[str]) -> list[str]:
        """`command` run in the namespace. nsenter joins the network namespace alone, unlike
        `ip netns exec`, which also remounts /sys and so hides the cgroup hierarchies."""
        return ["nsenter", f"--net={self.path}", "--", *command]

    def route_from_host(self, subnet: str) -> None:
        """The host sends `subnet` to the node; the route goes with the veth."""
        _ip("route", "replace", subnet, "via", NODE_ADDRESS, "dev", self.host_veth)

    def routes(self) -> str:
        return _ip("route", "show", netns=self.name)

    def links(self) -> list[str]:
        return [line.split()[0] for line in _ip("-br", "link", netns=self.name).splitlines()]

    def close(self) -> None:
        # Deleting the namespace deletes its end of the veth, and so the host's end.
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", self.host_veth], capture_output=True, check=False)


def create_node_network() -> NodeNetwork:
    suffix = uuid.uuid4().hex[:6]
    network = NodeNetwork(name=f"ipf-node-{suffix}", host_veth=f"ipfh{suffix}")
    try:
        _ip("netns", "add", network.name)
        _ip("link", "add", network.host_veth, "type", "veth", "peer", "name", "eth0", "netns", network.name)
        _ip("addr", "add", f"{HOST_ADDRESS}/{VETH_PREFIX}", "dev", network.host_veth)
        _ip("link", "set", network.host_veth, "up")
        _ip("link", "set", "lo", "up", netns=network.name)
        _ip("addr", "add", f"{NODE_ADDRESS}/{VETH_PREFIX}", "dev", "eth0", netns=network.name)
        _ip("link", "set", "eth0", "up", netns=network.name)
    except BaseException:
        network.close()
        raise
    return network


def remove_leftovers() -> list[str]:
    """Namespaces of earlier node fixtures that no process uses any more (a run killed before its
    teardown), deleted, and with each its veth pair; their names."""
    removed = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith("ipf-node-") and not _ip("netns", "pids", name).strip():
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
            removed.append(name)
    return removed


def host_addresses_in_use() -> bool:
    """Whether the host already holds the veth's address (another node fixture, or a leftover)."""
    return HOST_ADDRESS in _ip("-br", "addr")

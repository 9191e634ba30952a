# SPDX-License-Identifier: Apache-2.0
"""Where a command finds the node or etcd it is asked about, when that is not on this host.

`status --lab-node`, `node list --lab-node`, `maps dump --node`, `datapath ... --node`, and
`node list` or `--backend etcd` without etcd endpoints can talk to a node or an etcd of the
namespace lab. The CLI that ships knows nothing of the lab: the lab registers a `LabLocator` (and
a `Forwarder`, which runs commands about a lab inside a VM there) when it is installed (as a
`meshctl.cli` plugin), and without it these flags fail with one line instead of importing lab code
into the agent image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from meshctl.errors import MeshError


@dataclass(frozen=True)
class AgentTarget:
    """An agent's status address, the network namespace to dial it from (None: this one) and how
    long to wait for its answer (None: agent.server.answer_wait(); longer for an emulated VM's)."""

    netns: str | None
    addr: str
    wait: float | None = None


@dataclass(frozen=True)
class PinTarget:
    """A node's pinned BPF objects: the pin root, its network namespace and its name there."""

    pin_root: str
    netns: str | None  # None: this namespace (a VM node, seen from inside its VM)
    name: str


@dataclass(frozen=True)
class EtcdTarget:
    """How to reach a cluster's etcd: endpoints, TLS files and the namespace to dial from."""

    endpoints: tuple[str, ...]
    ca: str | None
    cert: str | None
    key: str | None
    netns: str | None
    user: str | None = None  # the etcd identity (docs/security.md): a lab gives out its admin's
    password_file: str | None = None


class LabLocator(Protocol):
    """Finds lab nodes and lab etcds by name; `lab` None means the only lab that is up."""

    def agent(self, lab: str | None, node: str) -> AgentTarget: ...

    def pins(self, lab: str | None, node: str) -> PinTarget | None:
        """Searches every lab that is up when `lab` is None; None when no lab has the node."""
        ...

    def etcd(self, lab: str | None, cluster: str | None) -> EtcdTarget: ...

    def clusters(self, lab: str | None) -> tuple[str, ...]:
        """The lab's clusters by name, in the order of its file."""
        ...

    def nodes(self, lab: str | None) -> tuple[str, ...]:
        """Every node of the lab as `cluster/node`."""
        ...

    def pods(self, lab: str | None) -> dict[str, str]:
        """The lab's pods by name (their namespace's, with and without the lab's prefix): address."""
        ...


class Forwarder(Protocol):
    """Runs a whole command where the lab lives (a lab inside a VM runs its commands there)."""

    def forward(self, argv: list[str]) -> int | None:
        """The exit status of `argv` run elsewhere, or None to run it here."""
        ...


_locator: list[LabLocator] = []
_forwarder: list[Forwarder] = []


def register_forwarder(f: Forwarder) -> None:
    _forwarder[:] = [f]


def forward(argv: list[str]) -> int | None:
    """The registered forwarder's answer for `argv` (None without one: run here)."""
    return _forwarder[0].forward(argv) if _forwarder else None


def register_lab(locator: LabLocator) -> None:
    _locator[:] = [locator]


def lab(flag: str = "--node") -> LabLocator:
    """The registered lab locator; one clear line when this installation has no lab."""
    if not _locator:
        raise MeshError(f"{flag}: the lab is not part of this installation (the agent image leaves it out)")
    return _locator[0]


def has_lab() -> bool:
    return bool(_locator)

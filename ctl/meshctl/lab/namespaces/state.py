# SPDX-License-Identifier: Apache-2.0
"""A lab's state file, /run/meshctl-lab/<lab>/state.json: every name and PID the lab made, written
as it goes (so `lab down` after a crash half-way still knows what to remove).

The state is typed dataclasses; on disk it is their fields as JSON objects, keys named as the
fields. Reading ignores keys it does not know and fills fields a file lacks with their defaults, so
a state written by any lab of this format (a namespace lab, a lab in one VM, a VM-per-node lab, the
one-node state inside a node's VM) reads back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from meshctl.errors import MISSING, InputError, MeshError
from meshctl.node.shell import pid_alive

LAB_ROOT = Path("/run/meshctl-lab")
DEFAULT_LEASE_TTL = 5


@dataclass
class PodState:
    """One pod: its namespace, its address and the host end `pod<k>` of its veth; a dual-stack pod
    (a node with an IPv4 and an IPv6 pod CIDR) has its IPv6 address in `ip6`."""

    netns: str
    ip: str
    host_if: str
    ip6: str | None = None

    def address(self, family: int) -> str | None:
        """The pod's address of IP family 4 or 6, None if it has none."""
        for a in (self.ip, self.ip6):
            if a is not None and (":" in a) == (family == 6):
                return a
        return None

    @property
    def index(self) -> int:
        return int(self.netns.rsplit("-p", 1)[1])  # `<node ns>-p<k>` (a CNI lab names host ends its own way)


@dataclass
class NatState:
    """The NAT router a node sits behind (lab.nat); `port` is None for a symmetric NAT (random per
    destination)."""

    kind: str
    router_ns: str
    table: str
    inside_ip: str
    router_ip: str
    public_ip: str
    port: int | None = None
    rebinds: int = 0
    firewall6_ip: str | None = None  # a dual-stack node's public IPv6 address, firewalled by this NAT's router


@dataclass
class NicState:
    """A VM node's NIC: the tap on the lab's bridge, its MAC and its name in the guest."""

    tap: str
    mac: str
    name: str


@dataclass
class VmRecord:
    """What finds a running VM again from another process (its vm.json, and the lab state's copy)."""

    name: str
    series: str
    workdir: str
    version: str | None = None
    pid: int | None = None
    qemu_pid: int | None = None
    accel: str | None = None
    boot_seconds: float | None = None
    cpus: int | None = None
    memory: str | None = None
    netns: str | None = None
    nics: list[list[str]] = field(default_factory=list)


@dataclass
class NodeState:
    """One lab node. `netns` is None for a VM node (its agent runs in its guest's root namespace):
    its VM is `vm`, its agent's PID there `guest_pid` (never `pid`, a PID of this host), and its
    agent is dialled from `status_netns`."""

    name: str
    netns: str | None
    pod_cidrs: list[str]  # the node's pod CIDRs; its pods get an address in each
    public_ip: str
    metrics_addr: str
    dir: str
    state_dir: str
    wg_run_dir: str
    location: str = ""
    internal_ip: str | None = None
    leader: bool = False
    persistent_keepalive: int = 0
    allowed_location_ips: list[str] = field(default_factory=list)
    private_interface: str | None = None
    public_interface: str = "pub"
    pods: list[PodState] = field(default_factory=list)
    pid: int | None = None
    agent_args: list[str] = field(default_factory=list)
    nat: NatState | None = None
    kernel: str | None = None
    status_netns: str | None = None
    guest_pid: int | None = None
    nics: list[NicState] = field(default_factory=list)
    vm: VmRecord | None = None
    # The IPv6 addresses of a dual-stack node's private and public NICs (IPv4 ones above); on an
    # IPv6-only node internal_ip and public_ip are IPv6 themselves.
    internal_ip6: str | None = None
    public_ip6: str | None = None
    # The IP families of its NICs when they are not the lab's (nodes[].ip_families); empty: the lab's.
    ip_families: list[int] = field(default_factory=list)
    # lab.agent image: the node's containers (namespaces/image_agents.py) and its agent's pin root
    # (its own bpffs folder's `meshctl`; None: the lab's `<pin_root>/<cluster>`).
    containers: list[str] = field(default_factory=list)
    pin_root: str | None = None

    @property
    def dial_netns(self) -> str | None:
        """The namespace this node's agent is dialled from: its own, or for a VM node the one on
        its public segment (its etcd's)."""
        return self.status_netns or self.netns

    @property
    def pods_cidr(self) -> str:
        """The pod CIDR a CNI lab wires this node's pods in: the first its record lists."""
        return self.pod_cidrs[0]

    @property
    def agent_started(self) -> bool:
        """Whether the lab started this node's agent (here, or inside the node's VM)."""
        return bool(self.pid or self.guest_pid)


@dataclass
class Identity:
    """One etcd identity: user, password file, client certificate and key."""

    user: str
    password_file: str
    cert: str
    key: str


@dataclass
class EtcdServerState:
    """What restarts a lab cluster's etcd with the same data and certificates."""

    name: str
    data_dir: str
    host: str
    port: int
    cert: str
    key: str
    log: str
    more_hosts: list[str] = field(default_factory=list)  # its address of the lab's other IP family


@dataclass
class EtcdAccess:
    """How to reach a lab cluster's etcd: endpoints, CA, the admin's credentials, every identity,
    the namespace to dial from, and the server's PID and restart record."""

    endpoints: list[str]
    ca: str
    cert: str
    key: str
    netns: str | None = None
    user: str | None = None
    password_file: str | None = None
    identities: dict[str, Identity] = field(default_factory=dict)
    pid: int | None = None
    server: EtcdServerState | None = None


@dataclass
class KubeAccess:
    """A lab cluster's control plane (lab.backend: kubernetes): a real kube-apiserver and
    kube-controller-manager with their etcd in namespace `netns` (lab.rigs.kube_control_plane)."""

    url: str  # on the lab's public segment, as the agents dial it
    kubeconfig: str  # the admin's (client certificate), for `url`
    netns: str
    pid: int  # the API server's
    dir: str = ""  # the control plane's directory (PKI, logs, etcd data)
    # The same API server seen from the host's network namespace (127.0.0.1, through
    # lab.rigs.tcp_forward), for the host's kubectl (`meshctl lab kubeconfig`).
    host_kubeconfig: str = ""
    ca: str = ""
    # Each node's agent: a kubeconfig with the token of the `meshctl` ServiceAccount bound to that
    # node's DaemonSet Pod (what the kubelet projects into the Pod), by node name.
    agent_kubeconfigs: dict[str, str] = field(default_factory=dict)


@dataclass
class ClusterState:
    name: str
    id: int
    etcd: EtcdAccess
    port: int
    mesh: dict[str, str] = field(default_factory=dict)
    nodes: list[NodeState] = field(default_factory=list)
    clustermesh_dir: str | None = None
    kube: KubeAccess | None = None


@dataclass
class FabricState:
    """One private subnet's fabric as built: bridge `bpriv<index>`, its router namespace if routed,
    its kind now and the addressing it was built with."""

    index: int
    kind: str
    network: str
    loss: int
    bridge: str
    router: str | None
    addressing: str
    # The IPv6 subnet the same bridge carries in a dual-stack lab (derived, namespaces/families.py).
    subnet6: str | None = None


@dataclass
class InVm:
    """In a VM node's own one-node state: which node this guest is and the kernel it booted."""

    node: str
    series: str


@dataclass
class LabState:
    """A lab: a namespace lab (every field), a lab inside one VM (`vm`, `kernel`, `timings`: the
    lab itself is in the guest's state), or a VM-per-node lab (`vms`, nodes with a `vm`)."""

    name: str
    prefix: str
    dir: str
    source: str | None = None
    created: float = 0.0
    namespaces: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    pin_root: str = ""
    clusters: list[ClusterState] = field(default_factory=list)
    fastpath: bool = True
    lease_ttl: int = DEFAULT_LEASE_TTL
    agent_args: list[str] = field(default_factory=list)
    vms: bool = False
    fabrics: dict[str, FabricState] = field(default_factory=dict)
    in_vm: InVm | None = None
    kernel: str | None = None
    vm: VmRecord | None = None
    timings: dict[str, float] | None = None
    ip_families: list[int] = field(default_factory=lambda: [4])  # of its underlay (lab.ip_families)
    image: str | None = None  # lab.agent image: the agents run from this image (namespaces/image_agents.py)
    cni: str = ""  # lab.cni

    @property
    def pod_families(self) -> list[int]:
        """The IP families of the lab's pods (what `lab check` pings in)."""
        return sorted({4 if "." in c else 6 for _, n in self.nodes() for c in n.pod_cidrs})

    def nodes(self) -> list[tuple[ClusterState, NodeState]]:
        """Every node with its cluster, in order."""
        return [(c, n) for c in self.clusters for n in c.nodes]

    def cluster(self, name: str) -> ClusterState:
        for c in self.clusters:
            if c.name == name:
                return c
        raise MeshError(f"lab {self.name} has no cluster {name}")

    def families_of(self, node: NodeState) -> list[int]:
        """The IP families of a node's NICs: its own, else the lab's."""
        return node.ip_families or self.ip_families

    def pin_root_of(self, cluster: ClusterState, node: NodeState) -> str:
        """The pin root of a node's agent (its pins are under `<pin root>/<node>`)."""
        return node.pin_root or f"{self.pin_root}/{cluster.name}"

    def lookup(self, node: str) -> tuple[ClusterState, NodeState]:
        """A node by name or `cluster/name`."""
        for c, n in self.nodes():
            if node in (n.name, f"{c.name}/{n.name}"):
                return c, n
        raise MeshError(f"lab {self.name} has no node {node}")


# --- JSON --------------------------------------------------------------------------------------

T = TypeVar("T")


def to_json(value: object) -> Any:
    """A state object as plain JSON values (dataclasses as objects keyed by field name)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _convert(next(a for a in get_args(tp) if a is not type(None)), value)
    if origin is list:
        return [_convert(get_args(tp)[0], v) for v in value]
    if origin is dict:
        return {k: _convert(get_args(tp)[1], v) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_json(tp, value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def from_json(cls: type[T], doc: dict[str, Any]) -> T:
    """`cls` (a state dataclass) from its JSON object: unknown keys ignored, missing ones defaulted."""
    hints = get_type_hints(cls)
    kwargs = {f.name: _convert(hints[f.name], doc[f.name]) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
              if f.name in doc}
    return cls(**kwargs)


# --- the file ----------------------------------------------------------------------------------


def lab_name(prefix: str) -> str:
    """A lab is named after its prefix (`ml-` -> `ml`): one namespace prefix, one lab."""
    return prefix.rstrip("-")


def lab_dir(name: str) -> Path:
    return LAB_ROOT / name


def state_path(name: str) -> Path:
    return lab_dir(name) / "state.json"


_SAVING = threading.Lock()  # a multi-VM lab saves from one thread per VM


def save(state: LabState) -> None:
    p = state_path(state.name)
    with _SAVING:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(to_json(state), indent=1, sort_keys=True))
        os.replace(tmp, p)


def load(name: str) -> LabState | None:
    try:
        doc = json.loads(state_path(name).read_text())
        return from_json(LabState, doc) if isinstance(doc, dict) else None
    except (OSError, ValueError, TypeError, AttributeError):  # unreadable, or not a lab state
        return None


def labs_up() -> list[str]:
    if not LAB_ROOT.exists():
        return []
    return sorted(p.name for p in LAB_ROOT.iterdir() if (p / "state.json").exists())


def resolve(name: str | None) -> LabState:
    """The state of lab `name`, or of the only lab that is up."""
    if name is None:
        up = labs_up()
        if not up:
            raise MeshError("no lab is up (meshctl lab up -f FILE)")
        if len(up) > 1:
            raise MeshError(f"several labs are up ({', '.join(up)}): pass --lab NAME")
        name = up[0]
    st = load(name)
    if st is None:
        raise MeshError(f"lab {name} is not up (no {state_path(name)})")
    return st


def find_node(lab: str | None, node: str) -> tuple[str | None, str]:
    """(netns to dial from, metrics address) of a lab node, by name or `cluster/name`: its own
    namespace, or for a VM node the namespace on its public segment (its etcd's)."""
    _, n = resolve(lab).lookup(node)
    return n.dial_netns, n.metrics_addr


def etcd_access(lab: str | None, cluster: str | None = None) -> EtcdAccess:
    """How to reach a lab cluster's etcd: endpoints, ca, cert, key and the namespace to dial from."""
    st = resolve(lab)
    for c in st.clusters:
        if cluster in (None, "default", c.name):
            if cluster == "default" and c.name != "default" and len(st.clusters) > 1:
                continue
            return c.etcd
    raise InputError("--cluster-name", cluster, f"is not a cluster of lab {st.name} (its clusters: "
                     f"{', '.join(c.name for c in st.clusters)})")


def kube_access(lab: str | None, cluster: str | None = None) -> KubeAccess:
    """The API server of a running lab's Kubernetes cluster: the named one, or the only one.
    InputError (one line, exit 2) when the lab is not up, has no such cluster or several and
    none named, or its API server is not running."""
    if lab is not None and load(lab) is None:
        raise InputError("--lab", lab, f"is not up (no {state_path(lab)})")
    try:
        st = resolve(lab)
    except MeshError as e:
        raise InputError("--lab", MISSING, str(e)) from None
    kube = [c for c in st.clusters if c.kube is not None]
    if not kube:
        raise InputError("--lab", st.name, "has no Kubernetes API server (its lab.backend is etcd)")
    if cluster is not None:
        kube = [c for c in kube if c.name == cluster]
        if not kube:
            names = ", ".join(c.name for c in st.clusters)
            raise InputError("--cluster-name", cluster, f"is not a Kubernetes cluster of lab {st.name} ({names})")
    if len(kube) > 1:
        raise InputError("--cluster-name", MISSING, f"lab {st.name} has {len(kube)} clusters "
                         f"({', '.join(c.name for c in kube)}): pass --cluster-name")
    access = kube[0].kube
    assert access is not None
    if not access.host_kubeconfig or not Path(access.host_kubeconfig).exists() or not pid_alive(access.pid):
        raise InputError("--cluster-name", kube[0].name, f"has no API server running in lab {st.name}")
    return access


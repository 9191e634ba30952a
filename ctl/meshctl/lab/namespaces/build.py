# SPDX-License-Identifier: Apache-2.0
"""`meshctl lab up` / `lab down`: namespaces, bridges, pods, etcd over mTLS and one agent per node.

Layout (prefix P, e.g. `ml-`):
    P fab              fabric: bridge `bpriv<i>` per private subnet, bridge `bpub` (198.51.100.0/24, and
                       2001:db8:100::/64 with IPv6: namespaces/families.py); each private subnet
                       forwards as its `lab.fabrics` kind says (namespaces/fabric.py)
    P rt<j>            router of routed network j (vpc, vpc-udp, hetzner fabrics)
    P etcd-<cluster>   etcd on the public segment (198.51.100.250 downwards), TLS + client certs
    P <node>           node: `priv` (its internal address), `pub` (198.51.100.10 upwards), `pod<k>`
                       host ends of pod veths, kilo0 made by its agent
    P <node>-nat       NAT router of a node listed in `lab.nat` (namespaces/nat_router.py): it holds the node's public
                       address; the node's `pub` then has 192.168.<i>.2/24 behind it
    P <node>-p<k>      pod: `eth0` with one address of each of the node's pod CIDRs, default via
                       169.254.1.1 (and fe80::1), addresses of the node's end; the node has a /32
                       (and /128) route to it on `pod<k>`
With `lab.ip_families` [4, 6] every NIC above has an IPv6 address too; with [6] only IPv6 ones
(pods keep an address in each of their node's pod CIDRs).
With several clusters node namespaces are `P<cluster>-<node>`. Nothing leaves these namespaces.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from meshctl import defaults
from meshctl.backends import etcd_identity as identity
from meshctl.backends.etcd import write_topology
from meshctl.errors import InputError, MeshError
from meshctl.etcd import EtcdClient
from meshctl.lab.namespaces import check, cni_install, daemonset, fabric, image_agents, kube_api, kube_cluster, podman
from meshctl.lab.namespaces import nat_router as labnat
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.cni_labs import CNI_LABS
from meshctl.lab.namespaces.fabric import add_address
from meshctl.lab.namespaces.families import PUBLIC_NET, PUBLIC_NET6, public6, subnet6
from meshctl.lab.namespaces.spec import DEFAULT_LEASE_TTL, LabSpec
from meshctl.lab.namespaces.state import (
    ClusterState,
    EtcdAccess,
    EtcdServerState,
    Identity,
    LabState,
    NodeState,
    PodState,
)
from meshctl.lab.namespaces.wiring import PRIVATE_NIC, Progress, add_ns, quiet, wire_pod
from meshctl.lab.rigs import netns, pki
from meshctl.lab.rigs.etcd_process import EtcdServer, stop_pid, stop_pids
from meshctl.lab.rigs.waiting import CONVERGE_WAIT, rest_after
from meshctl.mesh import global_ranges
from meshctl.mesh.model import IPNetwork, Node, Topology
from meshctl.node.cni import CONF_NAME

METRICS_ADDR = defaults.METRICS_ADDR
ETCD_PORT = 2379
# One request of the lab's own etcd set-up (users, roles, the first records): a guest under TCG
# emulation on a loaded host took more than the 2 s a lab client waits (the 6.1 VM lab, make test).
SEED_TIMEOUT_S = 15.0
# How a kind of lab is built, its agents started and the lab removed again (lab up undoes a failure).
Build = Callable[[LabSpec, LabState, Progress], None]
StartAgents = Callable[[LabState, Progress, tuple[str, ...]], None]
Down = Callable[[str, Progress], list[str]]


def node_ns(prefix: str, spec: LabSpec, cluster: str, node: str) -> str:
    return f"{prefix}{cluster}-{node}" if spec.multi else f"{prefix}{node}"




def up(spec: LabSpec, *, prefix: str | None = None, progress: Progress = quiet, wait: float = CONVERGE_WAIT,
       start_agents: bool = True, hold: tuple[str, ...] = (), spawn: Spawner | None = None) -> LabState:
    """Build the namespace lab and start its agents (except the nodes in `hold`, to start later with
    start_agent); returns the state (also in state.json). On failure everything made so far is
    removed again. `spawn` starts each agent (None: popen_spawner, a new process; inside a guest the
    lab's CLI passes one that forks its warm interpreter). A lab with lab.vms is brought up by
    lab/vms/vmnodes.py."""
    if spec.options.vms:
        raise MeshError("this lab has lab.vms: every node is a VM (meshctl lab up brings it up)")
    def start(st: LabState, p: Progress, held: tuple[str, ...]) -> None:
        start_all_agents(st, p, held, spawn=spawn or popen_spawner)
        if st.cni == cni_install.NAME:  # the pods, by the plugins, from the config each agent writes
            started = set(agents_to_start(st, held))
            for c, n in st.nodes():
                if f"{c.name}/{n.name}" in started:
                    cni_install.add_pods(st, n, spec.options.pods_per_node)
                    labstate.save(st)
            p(f"pods: {sum(len(n.pods) for _, n in st.nodes())} made by the CNI plugins "
              f"({cni_install.plugin_path()}) from the agents' {CONF_NAME}")

    return up_with(spec, build_namespaces, start, lambda name, p: down(name, progress=p), prefix=prefix,
                   progress=progress, wait=wait, start_agents=start_agents, hold=hold)


def up_with(spec: LabSpec, build: Build, start: StartAgents, remove: Down, *, prefix: str | None,
            progress: Progress, wait: float, start_agents: bool, hold: tuple[str, ...]) -> LabState:
    """Bring a lab up with `build`, its agents with `start`, and wait for them to converge; on any
    failure `remove` takes away what was built."""
    prefix = prefix or spec.options.prefix
    name = labstate.lab_name(prefix)
    if labstate.load(name) is not None or netns.list_prefixed(prefix):
        raise MeshError(f"lab {name} (prefix {prefix}) is already up: run `meshctl lab down --lab {name}` first")
    d = labstate.lab_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    st = LabState(name=name, prefix=prefix, source=spec.source, created=time.time(),
                  pin_root=f"/sys/fs/bpf/{prefix}lab", dir=str(d), fastpath=spec.options.fastpath,
                  lease_ttl=spec.options.lease_ttl or DEFAULT_LEASE_TTL, agent_args=list(spec.options.agent_args),
                  vms=spec.options.vms,
                  ip_families=list(spec.options.ip_families), cni=spec.options.cni,
                  image=agent_image(spec) if spec.options.agent == "image" else None)
    labstate.save(st)
    t0 = time.monotonic()
    try:
        build(spec, st, progress)
        if start_agents:
            start(st, progress, hold)
            wait_converged(st, progress, wait, hold)
    except BaseException:
        progress("lab up failed; removing what was built")
        try:
            remove(name, quiet)
        except Exception as e:  # noqa: BLE001 - the failure of `up` is the error to report, not this
            progress(f"removing what was built failed too: {e}")
        raise
    progress(f"lab {name} up in {time.monotonic() - t0:.1f} s")
    return st


def agent_image(spec: LabSpec) -> str:
    """The image agents run from (lab.agent image): `lab up --image`'s, else the DaemonSet's; it
    must be built here (`make image`)."""
    image = spec.options.image or daemonset.load().container(image_agents.AGENT).image
    if not podman.image_exists(image):
        raise MeshError(f"lab.agent image: {image} is not an image here (build it with `make image`, "
                        "or pass --image)")
    return image


def build_namespaces(spec: LabSpec, st: LabState, progress: Progress) -> None:
    """Build the fabric, each cluster's etcd (and API server) and its nodes, recording every name
    in the state as it is made so `lab down` can remove a half-built lab."""
    subnets = build_control(spec, st, progress)
    idx = 0
    for ci, topo in enumerate(spec.clusters):
        for n in topo.nodes:
            _node(spec, st, st.clusters[ci], topo, n, idx, subnets)
            idx += 1
        progress(f"cluster {topo.cluster.name}: {len(topo.nodes)} node(s), "
                 f"{len(topo.nodes) * spec.options.pods_per_node} pod(s)")
    apply_fabrics(st, progress)
    for cst in st.clusters:
        if cst.kube is not None:
            nodes = {n.name: (n.internal_ip or n.internal_ip6 or n.public_ip).split("/")[0] for n in cst.nodes}
            st.pids[f"kube-kubelets/{cst.name}"] = kube_cluster.join_nodes(
                cst.kube, nodes, {n.name: n.dir for n in cst.nodes})
            labstate.save(st)
            progress(f"kubernetes {cst.name}: {len(nodes)} node(s) Ready, each agent with its ServiceAccount token")


def apply_fabrics(st: LabState, progress: Progress) -> None:
    """Write every private subnet's forwarding rules (once its nodes' ports are on the bridges)."""
    fabric.apply_all(st)
    labstate.save(st)
    kinds = sorted({e.kind for e in st.fabrics.values()})
    progress(f"fabrics: {', '.join(kinds)}")


def build_control(spec: LabSpec, st: LabState, progress: Progress) -> list[IPNetwork]:
    """What every lab has whatever its nodes run in: the fabric namespace with its bridges and
    routers, and each cluster's etcd (and API server) on the public segment; returns the private
    subnets (bridge `bpriv<i>` is subnet i). The order matters: the fabric first, each cluster's
    etcd seeded before its identities are given out, the state saved after each cluster."""
    fab, subnets = _build_fabric(spec, st, progress)
    for ci, topo in enumerate(spec.clusters):
        cst = _start_etcd(spec, st, fab, ci, topo)
        st.clusters.append(cst)
        if spec.options.backend == "kubernetes":
            _start_kube(st, fab, ci, topo, cst, progress, spec.options.cni if spec.options.cni in CNI_LABS else "")
        labstate.save(st)
        progress(f"etcd {cst.name}: {cst.etcd.endpoints[0]} (mTLS) in {cst.etcd.netns}")
    _clustermesh_dirs(spec, st)
    return subnets


def _build_fabric(spec: LabSpec, st: LabState, progress: Progress) -> tuple[str, list[IPNetwork]]:
    """The fabric namespace: the public bridge, one bridge per private subnet, and the routers
    the fabrics ask for; returns its name and the private subnets."""
    fab = add_ns(st, f"{st.prefix}fab")
    netns.bridge(fab, "bpub")
    subnets = spec.private_subnets()
    for i, _ in enumerate(subnets):
        netns.bridge(fab, f"bpriv{i}")
    dual = spec.options.ip_families == (4, 6)
    fabric.build_routers(st, spec.options.fabrics, subnets, lambda name: add_ns(st, name),
                         {s: subnet6(s) for s in subnets if s.version == 4} if dual else None)
    segment = " and ".join(str(n) for n in (PUBLIC_NET, PUBLIC_NET6) if n.version in spec.options.ip_families)
    progress(f"fabric {fab}: {len(subnets)} private subnet(s), public segment {segment}")
    return fab, subnets


def public_addresses(families: Sequence[int], ip4: ipaddress.IPv4Address) -> list[str]:
    """The public addresses (CIDRs) of public slot `ip4` in each of `families`: `ip4` itself and
    its IPv6 twin (namespaces/families.py)."""
    out = [f"{ip4}/{PUBLIC_NET.prefixlen}"] if 4 in families else []
    return out + ([f"{public6(ip4)}/{PUBLIC_NET6.prefixlen}"] if 6 in families else [])


def _on_public(st: LabState, fab: str, name: str, veth: str, ip4: ipaddress.IPv4Address) -> list[str]:
    """A namespace `name` with one NIC `pub` on the public bridge at public slot `ip4`, in every
    family of the lab; returns its addresses (IPv4 first)."""
    ns = add_ns(st, name)
    netns.veth(fab, veth, ns, "pub")
    netns.enslave(fab, veth, "bpub")
    cidrs = public_addresses(st.ip_families, ip4)
    for cidr in cidrs:
        add_address(ns, "pub", cidr)
    return [c.split("/")[0] for c in cidrs]


def _start_etcd(spec: LabSpec, st: LabState, fab: str, ci: int, topo: Topology) -> ClusterState:
    """Cluster `ci`'s etcd on the public segment over mTLS, its PKI and identities made, seeded
    with the cluster's settings while auth is still off, then its users provisioned."""
    cname = topo.cluster.name
    ens = f"{st.prefix}etcd-{cname}"
    ip, *more = _on_public(st, fab, ens, f"e{ci}", PUBLIC_NET.network_address + 250 - ci)
    d = Path(st.dir)
    pdir = d / "pki" / cname
    ca = pki.make_ca(pdir, f"meshctl-lab-{cname}")
    server_cert = pki.make_cert(ca, pdir, "etcd", server=True, hosts=(ip, *more, "127.0.0.1"))
    ids = _identities(spec, topo, ca, pdir)
    admin = ids["admin"]
    admin_cert = pki.CertFiles(Path(admin.cert), Path(admin.key), ca.cert)
    srv = EtcdServer(f"{st.prefix}{cname}", d / "etcd" / cname, host=ip, port=ETCD_PORT, netns=ens,
                     tls=server_cert, log_file=d / f"etcd-{cname}.log", more_hosts=tuple(more))
    pid = srv.start(client_tls=admin_cert)
    st.pids[f"etcd/{cname}"] = pid
    access = EtcdAccess(
        endpoints=srv.urls, ca=str(ca.cert), cert=admin.cert, key=admin.key, user=admin.user,
        password_file=admin.password_file, identities=ids, netns=ens, pid=pid,
        server=EtcdServerState(name=srv.name, data_dir=str(srv.data_dir), host=ip, port=ETCD_PORT,
                               cert=str(server_cert.cert), key=str(server_cert.key), log=str(srv.log_file),
                               more_hosts=more))
    _seed_etcd(srv.client(admin_cert, timeout=SEED_TIMEOUT_S), spec, topo, ids)
    mesh: dict[str, str] = {"granularity": topo.mesh.granularity}
    if topo.mesh.global_cidrs:  # what the other clusters dial this one's pods at (check.dial_address)
        mesh["global_cidrs"] = global_ranges.as_text(topo.mesh.global_cidrs)
    return ClusterState(name=cname, id=topo.cluster.id, etcd=access, port=topo.mesh.port, mesh=mesh)


def _seed_etcd(client: EtcdClient, spec: LabSpec, topo: Topology, ids: dict[str, Identity]) -> None:
    """The cluster's settings and peers written, then every identity's user provisioned (auth on)."""
    cname = topo.cluster.name
    try:
        write_topology(client, topo.cluster, topo.mesh, topo.peers)
        identity.provision(
            client, cname, admin_password=Path(ids["admin"].password_file),
            nodes={n.name: Path(ids[n.name].password_file) for n in topo.nodes},
            readers={c.cluster.name: Path(ids[identity.remote_user(c.cluster.name)].password_file)
                     for c in spec.clusters if c is not topo},
            kvstore=Path(ids[identity.KVSTORE_USER].password_file) if identity.KVSTORE_USER in ids else None,
            cache=Path(ids[identity.CACHE_USER].password_file) if identity.CACHE_USER in ids else None)
    finally:
        client.close()


def _start_kube(st: LabState, fab: str, ci: int, topo: Topology, cst: ClusterState, progress: Progress,
                cni: str = "") -> None:
    """Cluster `ci`'s control plane on the public segment (the Kubernetes backend)."""
    cname = topo.cluster.name
    kns = f"{st.prefix}kube-{cname}"
    kip = _on_public(st, fab, kns, f"k{ci}", PUBLIC_NET.network_address + 240 - ci)[0]
    kube, pids = kube_cluster.start(Path(st.dir) / "kube" / cname, kns, kip, topo, cni=cni,
                                    agent_keys=image_agents.config_map(st))
    st.pids.update({f"{role}/{cname}": pid for role, pid in pids.items()})
    cst.kube = kube
    progress(f"kubernetes API {cname}: {kube.url} in {kns}")


def _identities(spec: LabSpec, topo: Topology, ca: pki.CertFiles, pdir: Path) -> dict[str, Identity]:
    """Each identity of one cluster's etcd (docs/security.md): the operator (`admin`, etcd's root),
    one per node (its node name), one per other cluster that reads this one, and the kvstore
    mirror's with the Kubernetes backend. Each gets a password file (0600) and a client
    certificate naming it in OU (the gateway refuses a CN once auth is on)."""
    users = {"admin": identity.ADMIN_USER}
    users.update({n.name: identity.node_user(n.name) for n in topo.nodes})
    users.update({identity.remote_user(c.cluster.name): identity.remote_user(c.cluster.name)
                  for c in spec.clusters if c is not topo})
    if spec.options.backend == "kubernetes":
        users[identity.KVSTORE_USER] = identity.KVSTORE_USER
    if spec.multi and spec.options.clustermesh:  # the cluster-mesh cache's (start_cache)
        users[identity.CACHE_USER] = identity.CACHE_USER
    out: dict[str, Identity] = {}
    for name, user in users.items():
        fname = name.replace(":", "-")
        cert = pki.make_cert(ca, pdir, f"id-{fname}", common_name=False)
        pw = identity.new_password(pdir / f"id-{fname}.password")
        out[name] = Identity(user=user, password_file=str(pw), cert=str(cert.cert), key=str(cert.key))
    return out


def etcd_identity(cluster_state: ClusterState, who: str) -> tuple[EtcdAccess, Identity]:
    """A lab cluster's etcd access and one of its identities (`admin`, a node name,
    `remote:<cluster>`, `meshctl:kvstore`): user, password file, client certificate and key."""
    e = cluster_state.etcd
    if who not in e.identities:
        raise InputError("--as", who, f"is not an etcd identity of cluster {cluster_state.name} "
                         f"(there are: {', '.join(sorted(e.identities)) or 'none'})")
    return e, e.identities[who]


def etcd_client(cluster_state: ClusterState, who: str = "admin", *, timeout: float = 2.0) -> EtcdClient:
    """A client of a lab cluster's etcd as one of its identities (`admin`, a node name,
    `remote:<cluster>`, `meshctl:kvstore`), dialled from the etcd's namespace."""
    e, i = etcd_identity(cluster_state, who)
    return EtcdClient(e.endpoints, ca=e.ca, cert=i.cert, key=i.key, netns=e.netns, timeout=timeout,
                      user=i.user, password_file=i.password_file)


def _clustermesh_dirs(spec: LabSpec, st: LabState) -> None:
    """Each cluster's agents get a directory with one file per OTHER cluster (Cilium's format)."""
    if not spec.multi or not spec.options.clustermesh:
        return
    for c in st.clusters:
        cm = Path(st.dir) / "clustermesh" / c.name
        cm.mkdir(parents=True, exist_ok=True)
        for other in st.clusters:
            if other.name == c.name:
                continue
            e = other.etcd
            i = e.identities[identity.remote_user(c.name)]  # the other cluster's read-only user for us
            doc = {"endpoints": e.endpoints, "ca-file": e.ca, "cert-file": i.cert, "key-file": i.key,
                   "username": i.user, "password-file": i.password_file}
            (cm / other.name).write_text(json.dumps(doc, indent=1) + "\n")
        c.clustermesh_dir = str(cm)


def _node(spec: LabSpec, st: LabState, cst: ClusterState, topo: Topology, n: Node, idx: int,
          subnets: list[IPNetwork]) -> None:
    prefix, fab = st.prefix, f"{st.prefix}fab"
    ns = add_ns(st, node_ns(prefix, spec, topo.cluster.name, n.name))
    pub_ip = PUBLIC_NET.network_address + 10 + idx
    if int(pub_ip) >= int(PUBLIC_NET.network_address) + 250 - len(spec.clusters):
        raise MeshError("too many lab nodes for the public segment")
    node_args: list[str] = []
    families = spec.options.families_of(n.name, topo.cluster.name)
    nat_kind = spec.options.nat_kind(n.name) or spec.options.nat_kind(f"{topo.cluster.name}/{n.name}")
    nat = None
    if nat_kind is not None:  # of the node's families (spec.py checks): a dual-stack node's IPv6 is firewalled
        public, plen = (public6(pub_ip), PUBLIC_NET6.prefixlen) if families == (6,) else (pub_ip, PUBLIC_NET.prefixlen)
        nat = labnat.build_router(prefix, fab, ns, idx, nat_kind, str(public), plen, topo.mesh.port,
                                  lambda name: add_ns(st, name),
                                  (str(public6(pub_ip)), PUBLIC_NET6.prefixlen) if families == (4, 6) else None)
    else:
        netns.veth(fab, f"n{idx}u", ns, "pub")
        netns.enslave(fab, f"n{idx}u", "bpub")
        for cidr in public_addresses(families, pub_ip):
            add_address(ns, "pub", cidr)
    private6 = spec.private_address6(n, topo.cluster.name)
    if n.internal_ip is not None:
        netns.veth(fab, f"n{idx}p", ns, PRIVATE_NIC)
        netns.enslave(fab, f"n{idx}p", f"bpriv{subnets.index(n.internal_ip.network)}")
        node_args = fabric.node_address(ns, PRIVATE_NIC, n.internal_ip, spec.options.fabrics,
                                        private6 if private6 != n.internal_ip else None)
    netns.sysctl(ns, "net.ipv4.ip_forward", "1")
    cni = CNI_LABS.get(spec.options.cni)
    if spec.options.cni == cni_install.NAME:
        pods = []  # made once the node's agent wrote its CNI config (cni_install.add_pods)
    else:
        pods = cni.wire_node(st, ns, topo, n, spec.options.pods_per_node) if cni else \
            [_pod(st, ns, n.pod_cidrs, k) for k in range(spec.options.pods_per_node)]
    nd = Path(st.dir) / "nodes" / (f"{topo.cluster.name}-{n.name}" if spec.multi else n.name)
    cst.nodes.append(NodeState(
        name=n.name, netns=ns, location=n.location, pod_cidrs=[str(c) for c in n.pod_cidrs],
        internal_ip=str(n.internal_ip) if n.internal_ip else None,
        public_ip=str(public6(pub_ip) if families == (6,) else pub_ip),
        internal_ip6=str(private6) if private6 is not None and private6 != n.internal_ip else None,
        public_ip6=str(public6(pub_ip)) if families == (4, 6) else None,
        ip_families=list(families) if families != spec.options.ip_families else [],
        leader=n.leader, persistent_keepalive=n.persistent_keepalive,
        allowed_location_ips=[str(a) for a in n.allowed_location_ips],
        private_interface=PRIVATE_NIC if n.internal_ip is not None else None, public_interface="pub",
        metrics_addr=METRICS_ADDR, dir=str(nd), state_dir=str(nd / "state"), wg_run_dir=str(nd / "wg"),
        pods=pods, pid=None, agent_args=node_args, nat=nat,
    ))
    if st.image:
        image_agents.adopt(st, cst, cst.nodes[-1])
    labstate.save(st)


def _pod(st: LabState, ns: str, pod_cidrs: Sequence[IPNetwork], k: int) -> PodState:
    """Pod `k` of node namespace `ns` (namespace `<ns>-p<k>`), with an address in each pod CIDR."""
    return wire_pod(st, ns, f"{ns}-p{k}", pod_cidrs, k)


def _namespace_node(st: LabState, node: str, cluster: str | None = None) -> NodeState:
    """A node of a running namespace lab by name (in `cluster`, if given)."""
    for c, n in st.nodes():
        if n.name == node and cluster in (None, c.name):
            if n.vm is not None:
                raise InputError("--node", node, "is a VM node (lab.vms): lab pod add and remove work on "
                                 "namespace labs only")
            return n
    raise InputError("--node", node, "is not a node of the lab")


def add_pod(name: str | None, node: str, cluster: str | None = None) -> PodState:
    """A new pod on a running lab's node (`meshctl lab pod add`): the agents find it by themselves."""
    st = labstate.resolve(name)
    n = _namespace_node(st, node, cluster)
    assert n.netns is not None
    k = max((p.index for p in n.pods), default=-1) + 1
    if k >= 250:
        raise MeshError(f"node {node} has no room for another pod")
    if st.cni == cni_install.NAME:
        pod = cni_install.add_pod(st, n, k)
    else:
        pod = _pod(st, n.netns, [ipaddress.ip_network(c) for c in n.pod_cidrs], k)
    n.pods.append(pod)
    labstate.save(st)
    return pod


def remove_pod(name: str | None, node: str, ip: str) -> None:
    """Take a pod away (its namespace and veth go, and with them the route)."""
    st = labstate.resolve(name)
    n = _namespace_node(st, node)
    for p in list(n.pods):
        if p.ip == ip:
            if st.cni == cni_install.NAME:
                cni_install.del_pod(st, n, p)
            netns.delete(p.netns)
            n.pods.remove(p)
            st.namespaces = [x for x in st.namespaces if x != p.netns]
            labstate.save(st)
            return
    raise InputError("--ip", ip, f"is not a pod of lab node {node}")


# --- agents ------------------------------------------------------------------------------------


def agent_argv(st: LabState, cst: ClusterState, node: NodeState) -> list[str]:
    """The command line of a node's agent process."""
    return [sys.executable, "-m", "meshctl.cli", "agent", *agent_flags(st, cst, node)]


def agent_files(cst: ClusterState, node: NodeState) -> list[str]:
    """The files and folders an agent's flags name that the lab made (its etcd identity on the etcd
    backend, the cluster-mesh folder, the kvstore identity): what an agent container gets bound
    read-only (its Kubernetes credentials are the service account's, image_agents)."""
    e = cst.etcd
    me = e.identities[node.name]
    files = [] if cst.kube else [e.ca, me.cert, me.key, me.password_file or ""]
    if cst.clustermesh_dir:
        files.append(cst.clustermesh_dir)
        for doc in Path(cst.clustermesh_dir).iterdir():
            ref = json.loads(doc.read_text())
            files += [ref.get(k) or "" for k in ("ca-file", "cert-file", "key-file", "password-file")]
    kv = e.identities.get(identity.KVSTORE_USER)
    if cst.kube and kv is not None and cst.clustermesh_dir:  # agent_flags' --kvstore-*
        files += [e.ca, kv.cert, kv.key, kv.password_file or ""]
    return sorted({f for f in files if f})


def agent_flags(st: LabState, cst: ClusterState, node: NodeState, *, pin_root: bool = True) -> list[str]:
    """`meshctl agent`'s flags for a lab node; without `pin_root` no --bpf-pin-root (an agent
    container pins under its own /sys/fs/bpf, the DaemonSet's default)."""
    e = cst.etcd
    me = e.identities[node.name]  # the node's own etcd identity: it may write only its record
    endpoints = ",".join(etcd_endpoints_for(st, e, node))
    argv = [
        "--node", node.name, "--pod-cidr", ",".join(node.pod_cidrs),
        "--public-interface", node.public_interface, "--state-dir", node.state_dir,
        "--wg-run-dir", node.wg_run_dir, "--metrics-addr", node.metrics_addr,
        "--backend", "etcd", "--etcd-endpoints", endpoints, "--etcd-ca", e.ca,
        "--etcd-cert", me.cert, "--etcd-key", me.key, "--etcd-user", me.user,
        "--etcd-password-file", me.password_file, "--cluster-name", cst.name,
        "--cluster-id", str(cst.id), *(["--bpf-pin-root", f"{st.pin_root}/{cst.name}"] if pin_root else []),
        "--lease-ttl", str(st.lease_ttl), "--nat-prefix", f"{st.prefix}nat",
    ]
    if node.location:
        argv += ["--location", node.location]
    if node.private_interface:
        argv += ["--private-interface", node.private_interface]
    if node.leader:
        argv.append("--leader")
    if node.persistent_keepalive:
        argv += ["--persistent-keepalive", str(node.persistent_keepalive)]
    if node.allowed_location_ips:
        argv += ["--allowed-location-ips", ",".join(node.allowed_location_ips)]
    if cst.clustermesh_dir:
        argv += ["--clustermesh-dir", cst.clustermesh_dir]
    if not st.fastpath and pin_root:  # an agent container reads it from the ConfigMap key fastpath
        argv.append("--no-fastpath")
    if st.cni == cni_install.NAME and pin_root:  # an agent container's is the node's, by the manifest's mount
        argv += ["--cni-conf-dir", str(cni_install.conf_dir(node))]
    argv += list(node.agent_args)
    argv += list(st.agent_args)
    if cst.kube:
        argv = kube_cluster.agent_argv(argv)
        if cst.clustermesh_dir and identity.KVSTORE_USER in e.identities:
            # In a cluster mesh the cluster's nodes (and global services) go to its etcd as the
            # kvstore identity, where the other clusters' agents read them.
            kv = e.identities[identity.KVSTORE_USER]
            argv += ["--kvstore-endpoints", endpoints, "--kvstore-ca", e.ca, "--kvstore-cert", kv.cert,
                     "--kvstore-key", kv.key, "--kvstore-user", kv.user, "--kvstore-password-file",
                     kv.password_file]
    return argv


def etcd_endpoints_for(st: LabState, e: EtcdAccess, node: NodeState) -> list[str]:
    """The etcd URLs a node can dial: those of its NICs' families (an IPv6-only node of a
    dual-stack lab dials etcd's IPv6 address)."""
    fams = st.families_of(node)
    return [u for u in e.endpoints if (6 if "[" in u else 4) in fams] or e.endpoints


class Spawner(Protocol):
    """Starts an agent's command line with its output on `log`, in a session of its own; its PID."""

    def __call__(self, argv: list[str], *, log: int, env: dict[str, str]) -> int: ...


def popen_spawner(argv: list[str], *, log: int, env: dict[str, str]) -> int:
    """The Spawner of the namespace lab: a new process."""
    return subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env).pid


def start_agent(st: LabState, node_name: str, *, extra_args: tuple[str, ...] = (),
                spawn: Spawner = popen_spawner, progress: Progress = quiet) -> int:
    """Start (or restart) one node's agent inside its namespace (None: here, as a VM node's guest
    does); records its PID. A VM node's agent is started through its VM (lab/vms/vmnodes.py), whose
    guest forks it from an interpreter that has imported it already (`spawn`)."""
    cst, node = st.lookup(node_name)
    if node.vm is not None:
        raise MeshError(f"{node_name} is a VM node: its agent runs in its VM")
    if node.pid and netns.pid_alive(node.pid):
        raise MeshError(f"the agent of {node_name} is already running (pid {node.pid})")
    Path(node.dir).mkdir(parents=True, exist_ok=True)
    if st.image:
        warnings: list[str] = []
        try:
            pid = image_agents.start(st, cst, node, st.image, [*agent_flags(st, cst, node, pin_root=False),
                                                               *extra_args], agent_files(cst, node), warnings)
        finally:
            labstate.save(st)
        for w in warnings:
            progress(f"warning: {node.name}'s pod: {w}")
        node.pid = pid
        st.pids[f"agent/{cst.name}/{node.name}"] = pid
        labstate.save(st)
        return pid
    log = open(Path(node.dir) / "agent.log", "ab")  # noqa: SIM115
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update(kube_cluster.agent_env(cst, node.name))
    try:
        argv = [*netns.exec_prefix(node.netns), *agent_argv(st, cst, node), *extra_args]
        pid = spawn(argv, log=log.fileno(), env=env)
    finally:
        log.close()
    node.pid = pid
    st.pids[f"agent/{cst.name}/{node.name}"] = pid
    labstate.save(st)
    return pid


# The ServiceAccount the cluster-mesh cache runs as (manifests/02-rbac.yaml) and the port its
# clusterset.local DNS server listens on in the lab (the etcd's namespace, root: 53 as CoreDNS dials).
CACHE_ACCOUNT = "meshctl-clustermesh-cache"
LAB_DNS_PORT = 53


def cache_dns(cst: ClusterState) -> tuple[str, int]:
    """Where a cluster's cache answers clusterset.local (`start_cache(mcs=True)`): its etcd's
    address, port LAB_DNS_PORT."""
    host = cst.etcd.endpoints[0].split("://", 1)[-1].rpartition(":")[0].strip("[]")
    return host, LAB_DNS_PORT


def start_cache(st: LabState, cluster: str, *, mcs: bool = False) -> int:
    """Start `meshctl clustermesh cache` of one cluster in its etcd's namespace (it reaches its own
    etcd as meshctl:clustermesh-cache and the others with the cluster's clustermesh files). With
    `mcs` (a Kubernetes cluster) it runs the Multi-Cluster Services controller with a token of the
    cache's own ServiceAccount, as the Deployment does, and answers clusterset.local at
    `cache_dns(cluster)`."""
    cst = st.cluster(cluster)
    if cst.clustermesh_dir is None:
        raise MeshError(f"cluster {cluster} has no clustermesh directory: the lab has no cluster mesh")
    e, i = etcd_identity(cst, identity.CACHE_USER)
    d = Path(st.dir) / "cache" / cluster
    d.mkdir(parents=True, exist_ok=True)
    argv = [*netns.exec_prefix(e.netns), sys.executable, "-m", "meshctl.cli", "clustermesh", "cache",
            "--etcd-endpoints", ",".join(e.endpoints), "--etcd-ca", e.ca, "--etcd-cert", i.cert, "--etcd-key", i.key,
            "--etcd-user", i.user or "", "--etcd-password-file", i.password_file or "",
            "--cluster-name", cst.name, "--cluster-id", str(cst.id), "--clustermesh-dir", cst.clustermesh_dir,
            "--state-dir", str(d / "state")]
    if mcs:
        if cst.kube is None:
            raise MeshError(f"cluster {cluster} is not a Kubernetes cluster: the Multi-Cluster Services API needs one")
        cp = kube_api.control_plane(cst.kube)
        tfile = d / "token"
        fd = os.open(tfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(cp.create_token(CACHE_ACCOUNT, "meshctl"))
        kc = cp.kubeconfig(d / "kubeconfig", token_file=tfile, user=f"system:serviceaccount:meshctl:{CACHE_ACCOUNT}")
        host, port = cache_dns(cst)
        argv += ["--mcs", "--kubeconfig", str(kc), "--dns-addr", f"{host}:{port}"]
    with open(d / "cache.log", "ab") as log:
        pid = popen_spawner(argv, log=log.fileno(), env=dict(os.environ, PYTHONUNBUFFERED="1"))
    st.pids[f"cache/{cluster}"] = pid
    labstate.save(st)
    return pid


def stop_cache(st: LabState, cluster: str) -> None:
    """SIGTERM one cluster's cache: its mirrored records stay (agents keep their routes)."""
    pid = st.pids.pop(f"cache/{cluster}", None)
    if pid:
        stop_pid(pid, 10)
    labstate.save(st)


def stop_agent(st: LabState, node_name: str, *, kill: bool = False) -> None:
    """SIGTERM (or SIGKILL) one agent: its routes, WireGuard and maps stay."""
    cst, node = st.lookup(node_name)
    if node.vm is not None:
        raise MeshError(f"{node_name} is a VM node: its agent runs in its VM")
    if node.containers:  # the agent's container; its wireguard-go sidecar stays up
        image_agents.stop(node, kill=kill)
    elif node.pid:
        stop_pid(node.pid, 0 if kill else 10)
    node.pid = None
    st.pids.pop(f"agent/{cst.name}/{node.name}", None)
    labstate.save(st)


def agents_to_start(st: LabState, hold: tuple[str, ...] = ()) -> list[str]:
    """`cluster/node` of every node whose agent starts with the lab (all but those in `hold`)."""
    return [f"{c.name}/{n.name}" for c, n in st.nodes() if n.name not in hold and f"{c.name}/{n.name}" not in hold]


def start_all_agents(st: LabState, progress: Progress, hold: tuple[str, ...] = (),
                     spawn: Spawner = popen_spawner) -> None:
    """Start every agent but those in `hold`."""
    todo = agents_to_start(st, hold)
    for key in todo:
        start_agent(st, key, spawn=spawn, progress=progress)
    progress(f"started {len(todo)} agent(s)" + (f" from {st.image} (podman, as the DaemonSet runs them)"
                                                 if st.image else ""))


# How long one status read of an agent may take while the lab waits for it: an agent under TCG
# emulation answers in a second or two while it compiles, and an unanswered read counts as "no status".
STATUS_POLL_TIMEOUT = 3.0


def wait_converged(st: LabState, progress: Progress, timeout: float, hold: tuple[str, ...] = ()) -> None:
    """Until every running agent has applied a plan holding every running node of its cluster."""
    deadline = time.monotonic() + timeout
    pending = {f"{c.name}/{n.name}": (c, n) for c, n in st.nodes()
               if n.name not in hold and f"{c.name}/{n.name}" not in hold}
    expect = {c.name: sum(1 for n in c.nodes if n.agent_started) for c in st.clusters}
    last_reason: dict[str, str] = {}
    while pending and time.monotonic() < deadline:
        started = time.monotonic()
        for key, (c, n) in list(pending.items()):
            if n.pid and not netns.pid_alive(n.pid):
                raise MeshError(f"the agent of {key} exited: {_log_tail(n)} (all of it: {n.dir}/agent.log)")
            s = check.agent_view(n, timeout=STATUS_POLL_TIMEOUT)
            if s is None:
                last_reason[key] = "no status yet"
                continue
            summary = s.summary
            if s.ready and summary and summary.last_reconcile.applied and summary.nodes == expect[c.name]:
                pending.pop(key)
                progress(f"agent {key}: {summary.granularity}, {len(s.live.peers)} peer(s), "
                         f"datapath {s.live.datapath.mode or 'loading'}")
            else:
                errors = summary.last_reconcile.errors if summary else None
                last_reason[key] = json.dumps(errors or s.reason or "converging")
        if pending:
            rest_after(started, 0.1)
    if pending:
        raise MeshError("agents did not converge within " f"{timeout:.0f} s: " + "; ".join(
            f"{k}: {last_reason.get(k, '?')}, its log ends: {_log_tail(n)}" for k, (_, n) in pending.items()))
    _wait_datapaths(st, progress, deadline, hold)


LOG_TAIL_LINES = 3  # of an agent's log, in the one-line error of a lab that did not come up


def _log_tail(n: NodeState) -> str:
    """The last lines of a node's agent log, joined into one line ("no log" without one)."""
    try:
        lines = (Path(n.dir) / "agent.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    lines = [image_agents.agent_log_line(line).strip() for line in lines if line.strip()]
    return " | ".join(lines[-LOG_TAIL_LINES:]) or "an empty log"


def _wait_datapaths(st: LabState, progress: Progress, deadline: float, hold: tuple[str, ...]) -> None:
    """Until every agent's fast path has loaded (or fallen back): traffic flows before that through
    kernel routes, but `lab check` right after `lab up` should show the paths users will get."""
    # A node without a private interface has no fast path to load (tunnel-only: kernel routes).
    loading = [n for c, n in st.nodes()
               if n.agent_started and n.private_interface and n.name not in hold and f"{c.name}/{n.name}" not in hold]
    modes: dict[str, str] = {}
    while loading and time.monotonic() < deadline:
        started = time.monotonic()
        for n in list(loading):
            s = check.agent_view(n, timeout=STATUS_POLL_TIMEOUT)
            mode = s.live.datapath.mode if s else None
            if mode == "kernel-routes" or (mode == "ebpf" and s and s.live.datapath.synced):
                modes[n.name] = mode
                loading.remove(n)
        if loading:
            rest_after(started, 0.2)
    if modes:
        summary = ", ".join(f"{m} on {sum(1 for x in modes.values() if x == m)}" for m in sorted(set(modes.values())))
        progress(f"datapath: {summary}" + (f"; still loading on {len(loading)}" if loading else ""))


def etcd_server(st: LabState, cluster: str) -> tuple[EtcdServer, pki.CertFiles]:
    """The lab etcd of `cluster` as an EtcdServer (to stop and start it in tests), and its client cert."""
    e = st.cluster(cluster).etcd
    s = e.server
    if s is None:
        raise MeshError(f"lab {st.name}: the etcd of {cluster} is not run by this host")
    srv = EtcdServer(s.name, Path(s.data_dir), host=s.host, port=s.port, netns=e.netns,
                     tls=pki.CertFiles(Path(s.cert), Path(s.key), Path(e.ca)), log_file=Path(s.log), pid=e.pid,
                     more_hosts=tuple(s.more_hosts))
    return srv, pki.CertFiles(Path(e.cert), Path(e.key), Path(e.ca))


def stop_etcd(st: LabState, cluster: str) -> None:
    srv, _ = etcd_server(st, cluster)
    srv.stop()
    st.cluster(cluster).etcd.pid = None
    st.pids.pop(f"etcd/{cluster}", None)
    labstate.save(st)


def start_etcd(st: LabState, cluster: str) -> None:
    srv, client = etcd_server(st, cluster)
    pid = srv.start(client_tls=client)
    st.cluster(cluster).etcd.pid = pid
    st.pids[f"etcd/{cluster}"] = pid
    labstate.save(st)


# --- down --------------------------------------------------------------------------------------


def down(name: str, *, progress: Progress = quiet) -> list[str]:
    """Remove a namespace lab: its recorded processes, pinned maps, namespaces (from the state file
    and by prefix scan) and its run directory. Works after a crash; returns what could not be
    removed. A VM-per-node lab's VMs are stopped first by lab/vms/vmnodes.py."""
    recorded = labstate.load(name)
    st = recorded or LabState(name=name, prefix=f"{name}-", dir=str(labstate.lab_dir(name)))
    prefix = st.prefix
    problems: list[str] = []
    pids = dict(st.pids)
    for c, n in st.nodes():
        if n.pid:
            pids[f"agent/{c.name}/{n.name}"] = n.pid
    # Pods the CNI plugins made: DEL while their nodes' namespaces and configs are there.
    if st.cni == cni_install.NAME:
        for _, n in st.nodes():
            for pod in n.pods:
                try:
                    cni_install.del_pod(st, n, pod)
                except (MeshError, OSError, subprocess.SubprocessError) as e:
                    problems.append(str(e))
    # Agent containers (lab.agent image), recorded or found by name, before the processes. Only a
    # lab that ran the image, or one whose state is gone, is looked for by name: a podman query
    # costs a minute in a TCG guest, whose labs run no containers.
    containers = [name for _, n in st.nodes() for name in n.containers]
    if st.image is not None or recorded is None:
        containers += [c for c in image_agents.leftovers(prefix) if c not in containers]
    for name in image_agents.remove_all(containers):
        problems.append(f"container {name} could not be removed")
    stop_pids([pid for what, pid in pids.items() if what.startswith("agent/")], 3)
    # wireguard-go processes the agents started: their pid files live in the lab's directory.
    d = labstate.lab_dir(name)
    wg_pids = []
    for pidfile in sorted(d.glob("nodes/*/wg/*.pid")) if d.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            wg_pids.append(int(pidfile.read_text().strip()))
    stop_pids(wg_pids, 3)
    stop_pids([pid for what, pid in pids.items() if not what.startswith("agent/")], 5)
    pin = Path(st.pin_root or f"/sys/fs/bpf/{prefix}lab")
    if pin.exists():
        shutil.rmtree(pin, ignore_errors=True)
        if pin.exists():
            problems.append(f"pinned objects left under {pin}")
    spaces = sorted(set(st.namespaces) | set(netns.list_prefixed(prefix)))
    for ns in spaces:
        if not ns.startswith(prefix):
            continue
        netns.delete(ns)
        if netns.exists(ns):
            problems.append(f"namespace {ns} could not be deleted")
    if d.exists():
        shutil.rmtree(d, ignore_errors=True)
    progress(f"lab {name} down: {len(spaces)} namespace(s), {len(pids)} process(es) removed")
    for p in problems:
        progress(f"warning: {p}")
    return problems

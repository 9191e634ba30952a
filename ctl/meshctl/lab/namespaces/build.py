"""`meshctl lab up` / `lab down`: namespaces, bridges, pods, etcd over mTLS and one agent per node.

Layout (prefix P, e.g. `ml-`):
    P fab              fabric: bridge `bpriv<i>` per private subnet, bridge `bpub` (198.51.100.0/24);
                       each private subnet forwards as its `lab.fabrics` kind says (lab/fabric.py)
    P rt<j>            router of routed network j (vpc, vpc-udp, hetzner fabrics)
    P etcd-<cluster>   etcd on the public segment (198.51.100.250 downwards), TLS + client certs
    P <node>           node: `priv` (its internal address), `pub` (198.51.100.10 upwards), `pod<k>`
                       host ends of pod veths, kilo0 made by its agent
    P <node>-nat       NAT router of a node listed in `lab.nat` (lab/nat.py): it holds the node's public
                       address; the node's `pub` then has 192.168.<i>.2/24 behind it
    P <node>-p<k>      pod: `eth0` with one address of the node's pod CIDR, default via 169.254.1.1
                       (an address of the node's end); the node has a /32 route to it on `pod<k>`
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshctl import defaults
from meshctl.backends import etcd_identity as identity
from meshctl.backends.etcd import write_topology
from meshctl.errors import InputError, MeshError
from meshctl.etcd import EtcdClient
from meshctl.lab import fabric, netns, pki
from meshctl.lab import nat as labnat
from meshctl.lab import state as labstate
from meshctl.lab.etcd_process import EtcdServer, stop_pid, stop_pids
from meshctl.lab.spec import PUBLIC_NET, LabSpec
from meshctl.mesh.model import IPNetwork, Topology

Progress = Callable[[str], None]
METRICS_ADDR = defaults.METRICS_ADDR
POD_GW = "169.254.1.1"
ETCD_PORT = 2379


def _quiet(_: str) -> None:
    pass


def node_ns(prefix: str, spec: LabSpec, cluster: str, node: str) -> str:
    return f"{prefix}{cluster}-{node}" if spec.multi else f"{prefix}{node}"


def pod_ip(pod_cidr: IPNetwork, k: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address of pod `k` of a node (its pod CIDR's third address onwards)."""
    return pod_cidr.network_address + 2 + k


def up(spec: LabSpec, *, prefix: str | None = None, progress: Progress = _quiet, wait: float = 60.0,
       start_agents: bool = True, hold: tuple[str, ...] = ()) -> dict[str, Any]:
    """Build the lab and start its agents (except the nodes in `hold`, to start later with
    start_agent); returns the state (also in state.json). On failure everything made so far is
    removed again."""
    prefix = prefix or spec.options.prefix
    name = labstate.lab_name(prefix)
    if labstate.load(name) is not None or netns.list_prefixed(prefix):
        raise MeshError(f"lab {name} (prefix {prefix}) is already up: run `meshctl lab down --lab {name}` first")
    d = labstate.lab_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    st: dict[str, Any] = {"name": name, "prefix": prefix, "source": spec.source, "created": time.time(),
                          "namespaces": [], "pids": {}, "pin_root": f"/sys/fs/bpf/{prefix}lab", "clusters": [],
                          "dir": str(d), "fastpath": spec.options.fastpath, "lease_ttl": spec.options.lease_ttl,
                          "agent_args": list(spec.options.agent_args), "vms": spec.options.vms}
    labstate.save(st)
    t0 = time.monotonic()
    try:
        if spec.options.vms:
            from meshctl.lab import vmnodes

            vmnodes.build(spec, st, progress)
        else:
            _build(spec, st, progress)
        if start_agents:
            start_all_agents(st, progress, hold)
            wait_converged(st, progress, wait, hold)
    except BaseException:
        progress("lab up failed; removing what was built")
        down(name, progress=_quiet)
        raise
    progress(f"lab {name} up in {time.monotonic() - t0:.1f} s")
    return st


def _ns(st: dict[str, Any], name: str) -> str:
    netns.add(name)
    st["namespaces"].append(name)
    labstate.save(st)
    return name


def _build(spec: LabSpec, st: dict[str, Any], progress: Progress) -> None:
    """Build the fabric, each cluster's etcd (and API server) and its nodes, recording every name
    in the state as it is made so `lab down` can remove a half-built lab."""
    subnets = build_control(spec, st, progress)
    idx = 0
    for ci, topo in enumerate(spec.clusters):
        for n in topo.nodes:
            _node(spec, st, st["clusters"][ci], topo, n, idx, subnets)
            idx += 1
        progress(f"cluster {topo.cluster.name}: {len(topo.nodes)} node(s), "
                 f"{len(topo.nodes) * spec.options.pods_per_node} pod(s)")
    apply_fabrics(st, progress)


def apply_fabrics(st: dict[str, Any], progress: Progress) -> None:
    """Write every private subnet's forwarding rules (once its nodes' ports are on the bridges)."""
    fabric.apply_all(st)
    labstate.save(st)
    kinds = sorted({e["kind"] for e in st["fabrics"].values()})
    progress(f"fabrics: {', '.join(kinds)}")


def build_control(spec: LabSpec, st: dict[str, Any], progress: Progress) -> list[IPNetwork]:
    """What every lab has whatever its nodes run in: the fabric namespace with its bridges and
    routers, and each cluster's etcd (and API server) on the public segment; returns the private
    subnets (bridge `bpriv<i>` is subnet i). One sequence of steps whose order matters, kept together."""
    prefix = st["prefix"]
    d = Path(st["dir"])
    fab = _ns(st, f"{prefix}fab")
    netns.bridge(fab, "bpub")
    subnets = spec.private_subnets()
    for i, _ in enumerate(subnets):
        netns.bridge(fab, f"bpriv{i}")
    fabric.build_routers(st, spec.options.fabrics, subnets, lambda name: _ns(st, name))
    progress(f"fabric {fab}: {len(subnets)} private subnet(s), public segment {PUBLIC_NET}")
    # etcd, one per cluster, on the public segment.
    for ci, topo in enumerate(spec.clusters):
        cname = topo.cluster.name
        ens = _ns(st, f"{prefix}etcd-{cname}")
        ip = str(PUBLIC_NET.network_address + 250 - ci)
        netns.veth(fab, f"e{ci}", ens, "pub")
        netns.enslave(fab, f"e{ci}", "bpub")
        netns.addr(ens, "pub", f"{ip}/{PUBLIC_NET.prefixlen}")
        pdir = d / "pki" / cname
        ca = pki.make_ca(pdir, f"meshctl-lab-{cname}")
        server_cert = pki.make_cert(ca, pdir, "etcd", server=True, hosts=(ip, "127.0.0.1"))
        ids = _identities(spec, topo, ca, pdir)
        admin = ids["admin"]
        admin_cert = pki.CertFiles(Path(admin["cert"]), Path(admin["key"]), ca.cert)
        srv = EtcdServer(f"{prefix}{cname}", d / "etcd" / cname, host=ip, port=ETCD_PORT, netns=ens,
                         tls=server_cert, log_file=d / f"etcd-{cname}.log")
        srv.start(client_tls=admin_cert)
        st["pids"][f"etcd/{cname}"] = srv.pid
        access = {"endpoints": [srv.url], "ca": str(ca.cert), "cert": admin["cert"], "key": admin["key"],
                  "user": admin["user"], "password_file": admin["password_file"], "identities": ids,
                  "netns": ens, "pid": srv.pid,
                  "server": {"name": srv.name, "data_dir": str(srv.data_dir), "host": ip, "port": ETCD_PORT,
                             "cert": str(server_cert.cert), "key": str(server_cert.key),
                             "log": str(srv.log_file)}}
        client = srv.client(admin_cert)  # auth is still off: seed the cluster, then give out identities
        try:
            write_topology(client, topo.cluster, topo.mesh, topo.peers)
            identity.provision(
                client, cname, admin_password=Path(admin["password_file"]),
                nodes={n.name: Path(ids[n.name]["password_file"]) for n in topo.nodes},
                readers={c.cluster.name: Path(ids[identity.remote_user(c.cluster.name)]["password_file"])
                         for c in spec.clusters if c is not topo},
                kvstore=Path(ids[identity.KVSTORE_USER]["password_file"]) if identity.KVSTORE_USER in ids else None)
        finally:
            client.close()
        st["clusters"].append({"name": cname, "id": topo.cluster.id, "etcd": access, "nodes": [],
                               "port": topo.mesh.port, "mesh": {"granularity": topo.mesh.granularity}})
        if spec.options.backend == "kubernetes":
            from meshctl.lab import kube as kubelab

            kns = _ns(st, f"{prefix}kube-{cname}")
            kip = str(PUBLIC_NET.network_address + 240 - ci)
            netns.veth(fab, f"k{ci}", kns, "pub")
            netns.enslave(fab, f"k{ci}", "bpub")
            netns.addr(kns, "pub", f"{kip}/{PUBLIC_NET.prefixlen}")
            kube = kubelab.start(d / "kube" / cname, kns, kip, topo)
            st["pids"][f"kube/{cname}"] = kube["pid"]
            st["clusters"][-1]["kube"] = kube
            progress(f"kubernetes API {cname}: {kube['url']} in {kns}")
        labstate.save(st)
        progress(f"etcd {cname}: {srv.url} (mTLS) in {ens}")
    _clustermesh_dirs(spec, st)
    return subnets


def _identities(spec: LabSpec, topo: Topology, ca: pki.CertFiles, pdir: Path) -> dict[str, dict[str, str]]:
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
    out: dict[str, dict[str, str]] = {}
    for name, user in users.items():
        fname = name.replace(":", "-")
        cert = pki.make_cert(ca, pdir, f"id-{fname}", common_name=False)
        pw = identity.new_password(pdir / f"id-{fname}.password")
        out[name] = {"user": user, "password_file": str(pw), "cert": str(cert.cert), "key": str(cert.key)}
    return out


def etcd_identity(cluster_state: dict[str, Any], who: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A lab cluster's etcd access and one of its identities (`admin`, a node name,
    `remote:<cluster>`, `meshctl:kvstore`): user, password file, client certificate and key."""
    e = cluster_state["etcd"]
    ids = e.get("identities") or {}
    if who not in ids:
        raise InputError("--as", who, f"is not an etcd identity of cluster {cluster_state['name']} "
                         f"(there are: {', '.join(sorted(ids)) or 'none'})")
    return e, ids[who]


def etcd_client(cluster_state: dict[str, Any], who: str = "admin", *, timeout: float = 2.0) -> EtcdClient:
    """A client of a lab cluster's etcd as one of its identities (`admin`, a node name,
    `remote:<cluster>`, `meshctl:kvstore`), dialled from the etcd's namespace."""
    e, i = etcd_identity(cluster_state, who)
    return EtcdClient(e["endpoints"], ca=e["ca"], cert=i["cert"], key=i["key"], netns=e["netns"], timeout=timeout,
                      user=i["user"], password_file=i["password_file"])


def _clustermesh_dirs(spec: LabSpec, st: dict[str, Any]) -> None:
    """Each cluster's agents get a directory with one file per OTHER cluster (Cilium's format)."""
    if not spec.multi or not spec.options.clustermesh:
        return
    for c in st["clusters"]:
        cm = Path(st["dir"]) / "clustermesh" / c["name"]
        cm.mkdir(parents=True, exist_ok=True)
        for other in st["clusters"]:
            if other["name"] == c["name"]:
                continue
            e = other["etcd"]
            i = e["identities"][identity.remote_user(c["name"])]  # the other cluster's read-only user for us
            doc = {"endpoints": e["endpoints"], "ca-file": e["ca"], "cert-file": i["cert"], "key-file": i["key"],
                   "username": i["user"], "password-file": i["password_file"]}
            (cm / other["name"]).write_text(json.dumps(doc, indent=1) + "\n")
        c["clustermesh_dir"] = str(cm)


def _node(spec: LabSpec, st: dict[str, Any], cst: dict[str, Any], topo: Topology, n: Any, idx: int,
          subnets: list[Any]) -> None:
    prefix, fab = st["prefix"], f"{st['prefix']}fab"
    ns = _ns(st, node_ns(prefix, spec, topo.cluster.name, n.name))
    pub_ip = PUBLIC_NET.network_address + 10 + idx
    if int(pub_ip) >= int(PUBLIC_NET.network_address) + 250 - len(spec.clusters):
        raise MeshError("too many lab nodes for the public segment")
    node_args: list[str] = []
    nat_kind = spec.options.nat_kind(n.name) or spec.options.nat_kind(f"{topo.cluster.name}/{n.name}")
    nat = None
    if nat_kind is not None:
        nat = labnat.build_router(prefix, fab, ns, idx, nat_kind, str(pub_ip), PUBLIC_NET.prefixlen, topo.mesh.port,
                                  lambda name: _ns(st, name))
    else:
        netns.veth(fab, f"n{idx}u", ns, "pub")
        netns.enslave(fab, f"n{idx}u", "bpub")
        netns.addr(ns, "pub", f"{pub_ip}/{PUBLIC_NET.prefixlen}")
    if n.internal_ip is not None:
        netns.veth(fab, f"n{idx}p", ns, "priv")
        netns.enslave(fab, f"n{idx}p", f"bpriv{subnets.index(n.internal_ip.network)}")
        node_args = fabric.node_address(ns, "priv", n.internal_ip, spec.options.fabrics)
    netns.sysctl(ns, "net.ipv4.ip_forward", "1")
    pods = [_pod(st, ns, n.pod_cidr, k) for k in range(spec.options.pods_per_node)]
    nd = Path(st["dir"]) / "nodes" / (f"{topo.cluster.name}-{n.name}" if spec.multi else n.name)
    cst["nodes"].append({
        "name": n.name, "netns": ns, "location": n.location, "pod_cidr": str(n.pod_cidr),
        "internal_ip": str(n.internal_ip) if n.internal_ip else None, "public_ip": str(pub_ip),
        "leader": n.leader, "persistent_keepalive": n.persistent_keepalive,
        "allowed_location_ips": [str(a) for a in n.allowed_location_ips],
        "private_interface": "priv" if n.internal_ip is not None else None, "public_interface": "pub",
        "metrics_addr": METRICS_ADDR, "dir": str(nd), "state_dir": str(nd / "state"), "wg_run_dir": str(nd / "wg"),
        "pods": pods, "pid": None, "agent_args": node_args, "nat": nat,
    })
    labstate.save(st)


def _pod(st: dict[str, Any], ns: str, pod_cidr: IPNetwork, k: int) -> dict[str, Any]:
    """Pod `k` of node namespace `ns` (namespace `<ns>-p<k>`)."""
    return wire_pod(st, ns, f"{ns}-p{k}", pod_cidr, k)


def wire_pod(st: dict[str, Any], ns: str | None, pod_ns: str, pod_cidr: IPNetwork, k: int) -> dict[str, Any]:
    """Pod `k` of the node in `ns` (None: this host, a VM node), in namespace `pod_ns`, wired as a
    routed CNI (Calico, ptp) does: a veth whose host end `pod<k>` holds the gateway address and a /32
    route to the pod's address. The route comes last, so the moment it exists the pod can be reached
    (what the agent's pod watcher keys on)."""
    pns = _ns(st, pod_ns)
    ip = pod_ip(pod_cidr, k)
    host_if = f"pod{k}"
    netns.veth(ns, host_if, pns, "eth0")
    netns.addr(ns, host_if, f"{POD_GW}/32")  # the pod's gateway answers ARP on every pod veth
    netns.addr(pns, "eth0", f"{ip}/32")
    netns.run(pns, ["ip", "route", "add", POD_GW, "dev", "eth0", "scope", "link"])
    netns.run(pns, ["ip", "route", "add", "default", "via", POD_GW, "dev", "eth0"])
    netns.run(ns, ["ip", "route", "add", f"{ip}/32", "dev", host_if])
    return {"netns": pns, "ip": str(ip), "host_if": host_if}


def add_pod(name: str | None, node: str, cluster: str | None = None) -> dict[str, Any]:
    """A new pod on a running lab's node (`meshctl lab pod add`): the agents find it by themselves."""
    st = labstate.resolve(name)
    for c in st["clusters"]:
        for n in c["nodes"]:
            if n["name"] == node and cluster in (None, c["name"]):
                if n.get("vm"):
                    raise InputError("--node", node, "is a VM node (lab.vms): lab pod add works on namespace labs only")
                k = max((int(p["host_if"].removeprefix("pod")) for p in n["pods"]), default=-1) + 1
                if k >= 250:
                    raise MeshError(f"node {node} has no room for another pod")
                pod = _pod(st, n["netns"], ipaddress.ip_network(n["pod_cidr"]), k)
                n["pods"].append(pod)
                labstate.save(st)
                return pod
    raise InputError("--node", node, "is not a node of the lab")


def remove_pod(name: str | None, node: str, ip: str) -> None:
    """Take a pod away (its namespace and veth go, and with them the route)."""
    st = labstate.resolve(name)
    for c in st["clusters"]:
        for n in c["nodes"]:
            for p in list(n["pods"]):
                if n["name"] == node and p["ip"] == ip:
                    if n.get("vm"):
                        raise InputError("--node", node, "is a VM node (lab.vms): lab pod remove works on namespace "
                                         "labs only")
                    netns.delete(p["netns"])
                    n["pods"].remove(p)
                    st["namespaces"] = [x for x in st["namespaces"] if x != p["netns"]]
                    labstate.save(st)
                    return
    raise InputError("--ip", ip, f"is not a pod of lab node {node}")


# --- agents ------------------------------------------------------------------------------------


def agent_argv(st: dict[str, Any], cst: dict[str, Any], node: dict[str, Any]) -> list[str]:
    e = cst["etcd"]
    me = e["identities"][node["name"]]  # the node's own etcd identity: it may write only its record
    argv = [
        sys.executable, "-m", "meshctl.cli", "agent", "--node-name", node["name"], "--pod-cidr", node["pod_cidr"],
        "--public-interface", node["public_interface"], "--state-dir", node["state_dir"],
        "--wg-run-dir", node["wg_run_dir"], "--metrics-addr", node["metrics_addr"],
        "--backend", "etcd", "--etcd-endpoints", ",".join(e["endpoints"]), "--etcd-ca", e["ca"],
        "--etcd-cert", me["cert"], "--etcd-key", me["key"], "--etcd-user", me["user"],
        "--etcd-password-file", me["password_file"], "--cluster-name", cst["name"],
        "--cluster-id", str(cst["id"]), "--bpf-pin-root", f"{st['pin_root']}/{cst['name']}",
        "--lease-ttl", str(st.get("lease_ttl", 5)), "--nat-prefix", f"{st['prefix']}nat",
    ]
    if node["location"]:
        argv += ["--location", node["location"]]
    if node["private_interface"]:
        argv += ["--private-interface", node["private_interface"]]
    if node["leader"]:
        argv.append("--leader")
    if node["persistent_keepalive"]:
        argv += ["--persistent-keepalive", str(node["persistent_keepalive"])]
    if node["allowed_location_ips"]:
        argv += ["--allowed-location-ips", ",".join(node["allowed_location_ips"])]
    if cst.get("clustermesh_dir"):
        argv += ["--clustermesh-dir", cst["clustermesh_dir"]]
    if not st.get("fastpath", True):
        argv.append("--no-fastpath")
    argv += list(node.get("agent_args", []))
    argv += list(st.get("agent_args", []))
    if cst.get("kube"):
        from meshctl.lab.kube import agent_argv as kube_argv

        argv = kube_argv(argv)
    return argv


def start_agent(st: dict[str, Any], node_name: str, *, extra_args: tuple[str, ...] = ()) -> int:
    """Start (or restart) one node's agent inside its namespace (or its VM); records its PID."""
    cst, node = lookup(st, node_name)
    if node.get("vm"):
        from meshctl.lab import vmnodes

        return vmnodes.start_agent(st, node, extra_args)
    if node.get("pid") and netns.pid_alive(node["pid"]):
        raise MeshError(f"the agent of {node_name} is already running (pid {node['pid']})")
    Path(node["dir"]).mkdir(parents=True, exist_ok=True)
    log = open(Path(node["dir"]) / "agent.log", "ab")  # noqa: SIM115
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if cst.get("kube"):
        from meshctl.lab.kube import agent_env

        env.update(agent_env(cst))
    try:
        p = subprocess.Popen([*netns.exec_prefix(node["netns"]), *agent_argv(st, cst, node), *extra_args],
                             stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    finally:
        log.close()
    node["pid"] = p.pid
    st["pids"][f"agent/{cst['name']}/{node['name']}"] = p.pid
    labstate.save(st)
    return p.pid


def stop_agent(st: dict[str, Any], node_name: str, *, kill: bool = False) -> None:
    """SIGTERM (or SIGKILL) one agent: its routes, WireGuard and maps stay."""
    cst, node = lookup(st, node_name)
    if node.get("vm"):
        from meshctl.lab import vmnodes

        vmnodes.stop_agent(st, node, kill=kill)
        return
    if node.get("pid"):
        stop_pid(node["pid"], 0 if kill else 10)
    node["pid"] = None
    st["pids"].pop(f"agent/{cst['name']}/{node['name']}", None)
    labstate.save(st)


def agent_started(node: dict[str, Any]) -> bool:
    """Whether the lab started this node's agent (here, or inside the node's VM)."""
    return bool(node.get("pid") or node.get("guest_pid"))


def lookup(st: dict[str, Any], node_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    for c in st["clusters"]:
        for n in c["nodes"]:
            if node_name in (n["name"], f"{c['name']}/{n['name']}"):
                return c, n
    raise MeshError(f"lab {st['name']} has no node {node_name}")


def start_all_agents(st: dict[str, Any], progress: Progress, hold: tuple[str, ...] = ()) -> None:
    """Start every agent but those in `hold`; VM nodes' at once (each start is a round trip into a
    slow guest)."""
    todo = [f"{c['name']}/{node['name']}" for c in st["clusters"] for node in c["nodes"]
            if node["name"] not in hold and f"{c['name']}/{node['name']}" not in hold]
    if st.get("vms"):
        from meshctl.lab.vmnodes import parallel

        parallel(todo, lambda key: start_agent(st, key))
    else:
        for key in todo:
            start_agent(st, key)
    progress(f"started {len(todo)} agent(s)")


def wait_converged(st: dict[str, Any], progress: Progress, timeout: float, hold: tuple[str, ...] = ()) -> None:
    """Until every running agent has applied a plan holding every running node of its cluster."""
    from meshctl.lab.probe import agent_status

    deadline = time.monotonic() + timeout
    pending = {f"{c['name']}/{n['name']}": (c, n) for c in st["clusters"] for n in c["nodes"]
               if n["name"] not in hold and f"{c['name']}/{n['name']}" not in hold}
    expect = {c["name"]: sum(1 for n in c["nodes"] if agent_started(n)) for c in st["clusters"]}
    last_reason: dict[str, str] = {}
    while pending and time.monotonic() < deadline:
        for key, (c, n) in list(pending.items()):
            if n.get("pid") and not netns.pid_alive(n["pid"]):
                raise MeshError(f"the agent of {key} exited; see {n['dir']}/agent.log")
            s = agent_status(n, timeout=0.5)
            if s is None:
                last_reason[key] = "no status yet"
                continue
            last = s.get("last_reconcile") or {}
            if s.get("ready") and last.get("applied") and s.get("nodes") == expect[c["name"]]:
                pending.pop(key)
                progress(f"agent {key}: {s.get('granularity')}, {len(s.get('peers', []))} peer(s), "
                         f"datapath {s.get('datapath', {}).get('mode') or 'loading'}")
            else:
                last_reason[key] = json.dumps(last.get("errors") or s.get("reason") or "converging")
        if pending:
            time.sleep(0.1)
    if pending:
        raise MeshError("agents did not converge within "
                        f"{timeout:.0f} s: " + "; ".join(f"{k}: {last_reason.get(k, '?')}" for k in pending))
    _wait_datapaths(st, progress, deadline, hold)


def _wait_datapaths(st: dict[str, Any], progress: Progress, deadline: float, hold: tuple[str, ...]) -> None:
    """Until every agent's fast path has loaded (or fallen back): traffic flows before that through
    kernel routes, but `lab check` right after `lab up` should show the paths users will get."""
    from meshctl.lab.probe import agent_status

    # A node without a private interface has no fast path to load (tunnel-only: kernel routes).
    loading = [n for c in st["clusters"] for n in c["nodes"]
               if agent_started(n) and n.get("private_interface") and n["name"] not in hold
               and f"{c['name']}/{n['name']}" not in hold]
    modes: dict[str, str] = {}
    while loading and time.monotonic() < deadline:
        for n in list(loading):
            dp = (agent_status(n, timeout=0.5) or {}).get("datapath") or {}
            mode = dp.get("mode")
            if mode == "kernel-routes" or (mode == "ebpf" and dp.get("synced")):
                modes[n["name"]] = mode
                loading.remove(n)
        if loading:
            time.sleep(0.2)
    if modes:
        summary = ", ".join(f"{m} on {sum(1 for x in modes.values() if x == m)}" for m in sorted(set(modes.values())))
        progress(f"datapath: {summary}" + (f"; still loading on {len(loading)}" if loading else ""))


def etcd_server(st: dict[str, Any], cluster: str) -> tuple[EtcdServer, pki.CertFiles]:
    """The lab etcd of `cluster` as an EtcdServer (to stop and start it in tests), and its client cert."""
    c = next(c for c in st["clusters"] if c["name"] == cluster)
    e, s = c["etcd"], c["etcd"]["server"]
    srv = EtcdServer(s["name"], Path(s["data_dir"]), host=s["host"], port=s["port"], netns=e["netns"],
                     tls=pki.CertFiles(Path(s["cert"]), Path(s["key"]), Path(e["ca"])), log_file=Path(s["log"]),
                     pid=e.get("pid"))
    return srv, pki.CertFiles(Path(e["cert"]), Path(e["key"]), Path(e["ca"]))


def stop_etcd(st: dict[str, Any], cluster: str) -> None:
    srv, _ = etcd_server(st, cluster)
    srv.stop()
    c = next(c for c in st["clusters"] if c["name"] == cluster)
    c["etcd"]["pid"] = None
    st["pids"].pop(f"etcd/{cluster}", None)
    labstate.save(st)


def start_etcd(st: dict[str, Any], cluster: str) -> None:
    srv, client = etcd_server(st, cluster)
    srv.start(client_tls=client)
    c = next(c for c in st["clusters"] if c["name"] == cluster)
    c["etcd"]["pid"] = srv.pid
    st["pids"][f"etcd/{cluster}"] = srv.pid
    labstate.save(st)


# --- down --------------------------------------------------------------------------------------


def down(name: str, *, progress: Progress = _quiet) -> list[str]:
    """Remove a lab: its recorded processes, pinned maps, namespaces (from the state file and by
    prefix scan) and its run directory. Works after a crash; returns what could not be removed."""
    st = labstate.load(name) or {"name": name, "prefix": f"{name}-", "pids": {}, "namespaces": [], "clusters": []}
    prefix = st["prefix"]
    from meshctl.lab import vmnodes

    problems: list[str] = vmnodes.stop_vms(name, st, progress)  # a VM node's PIDs are its guest's
    pids = dict(st.get("pids", {}))
    for c in st.get("clusters", []):
        for n in c.get("nodes", []):
            if n.get("pid"):
                pids[f"agent/{c['name']}/{n['name']}"] = n["pid"]
    stop_pids([pid for what, pid in pids.items() if what.startswith("agent/")], 3)
    # wireguard-go processes the agents started: their pid files live in the lab's directory.
    d = labstate.lab_dir(name)
    wg_pids = []
    for pidfile in sorted(d.glob("nodes/*/wg/*.pid")) if d.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            wg_pids.append(int(pidfile.read_text().strip()))
    stop_pids(wg_pids, 3)
    stop_pids([pid for what, pid in pids.items() if not what.startswith("agent/")], 5)
    pin = Path(st.get("pin_root") or f"/sys/fs/bpf/{prefix}lab")
    if pin.exists():
        shutil.rmtree(pin, ignore_errors=True)
        if pin.exists():
            problems.append(f"pinned objects left under {pin}")
    spaces = sorted(set(st.get("namespaces", [])) | set(netns.list_prefixed(prefix)))
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

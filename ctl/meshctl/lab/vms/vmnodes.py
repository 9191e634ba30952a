# SPDX-License-Identifier: Apache-2.0
"""The multi-VM lab (`lab: {vms: true}`): every node is its own VM booting the Debian kernel its
`nodes[].kernel` names, so one mesh mixes 5.10, 6.1 and 6.12 nodes with the kernels' own WireGuard,
tc hooks and verifiers. It is the runnable form of the Vagrant lab (vagrant/) on a machine without
Vagrant boxes.

Layout (prefix P; everything on the host side lives in lab namespaces, as in the namespace lab):
    P fab              bridges `bpub` and `bpriv<i>` (namespaces/fabric.py rules and routers apply as-is);
                       tap `n<i>u` (public) and `n<i>p` (private) of node i on them. QEMU runs inside
                       this namespace to open the taps, so no tap or bridge is ever in the host's own.
    P etcd-<cluster>   etcd over mTLS on the public segment, as in the namespace lab.
    VM <lab>-<node>    one per node (virtme-ng over the host's root, read-only, TCG where nested
                       KVM hangs): NICs `pub` and `priv` (renamed by MAC), pods as namespaces
                       `P<node>-p<k>`, and the agent in the guest's root namespace as on a real node.

The host's state (/run/meshctl-lab/<lab>/state.json) holds every node with its VM; the host reaches
each agent's /status on its public address from the cluster's etcd namespace and runs commands in
a guest through the VM's shared directory (vms/vm.py). Each guest also gets its own one-node lab
state, so `status --lab-node`, `maps dump --node` and `datapath status --node` forwarded into that
VM (vms/vmlab.py) work there as they do in a namespace lab.

A node's VM receives only its own etcd identity (CA, its client certificate, key and password file,
0600): one node's VM holds nothing that would let it write another node's record. Its WireGuard key
stays in the guest's own /run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from meshctl import defaults
from meshctl.errors import MeshError
from meshctl.lab.namespaces import build as labbuild
from meshctl.lab.namespaces import check, fabric
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import PUBLIC_NET, LabSpec
from meshctl.lab.namespaces.state import ClusterState, InVm, LabState, NicState, NodeState, VmRecord
from meshctl.lab.namespaces.wiring import Progress, pod_entry, quiet, wire_pod
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.waiting import CONVERGE_WAIT, wait_for
from meshctl.lab.vms import vm, zygote
from meshctl.lab.vms.vm import VM_ROOT
from meshctl.mesh.model import IPNetwork, Node
from meshctl.node.shell import pid_alive

NODE_CPUS = 1
NODE_MEMORY = "1G"
METRICS_PORT = int(defaults.METRICS_ADDR.rsplit(":", 1)[1])
GUEST_NODE_FILE = "node.json"
# The node preparation the Vagrant VMs run too (sysctls, bpffs): one script for both labs.
NODE_PREP = Path(__file__).resolve().parents[4] / "vagrant" / "node-prep.sh"
MAC_PREFIX = "52:54:00:6d"  # QEMU's locally administered range; then node index and NIC
T = TypeVar("T")


def vm_dir(lab: str, node_key: str) -> Path:
    return VM_ROOT / lab / node_key


def _mac(idx: int, nic: int) -> str:
    return f"{MAC_PREFIX}:{idx:02x}:{nic:02x}"


def parallel(items: Sequence[T], fn: Callable[[T], object]) -> None:
    """Run `fn` on every item at once (VMs boot and configure in parallel); the first error wins,
    after every thread has ended."""
    errors: list[BaseException] = []

    def one(item: T) -> None:
        try:
            fn(item)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(it,), daemon=True) for it in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# --- host side ---------------------------------------------------------------------------------


def up(spec: LabSpec, *, prefix: str | None = None, progress: Progress = quiet, wait: float = CONVERGE_WAIT,
       start_agents: bool = True, hold: tuple[str, ...] = ()) -> LabState:
    """Bring a lab.vms lab up: build_vms, every agent started in its VM, converged; on failure
    everything is removed again (VMs included)."""
    return labbuild.up_with(spec, build_vms, start_all_agents, lambda name, p: down(name, progress=p),
                            prefix=prefix, progress=progress, wait=wait, start_agents=start_agents, hold=hold)


def build_vms(spec: LabSpec, st: LabState, progress: Progress) -> None:
    """Fabric and etcds (build.build_control), a VM per node on taps of the lab's bridges, each guest
    wired as a node (NICs, pods, its etcd identity). Everything is recorded in the state as it is made,
    each VM before it boots (so `lab down` stops it after a crash)."""
    subnets = labbuild.build_control(spec, st, progress)
    fab = f"{st.prefix}fab"
    if not vm.warm_bpf_cache():
        progress("could not compile the datapath on the host: the guests' agents compile it (slow under TCG)")
    idx = 0
    for ci, topo in enumerate(spec.clusters):
        cst = st.clusters[ci]
        for n in topo.nodes:
            cst.nodes.append(_vm_node(spec, st, cst, topo.cluster.name, n, idx, subnets))
            idx += 1
        progress(f"cluster {topo.cluster.name}: {len(topo.nodes)} node VM(s): "
                 + ", ".join(f"{n.name} ({n.kernel})" for n in cst.nodes))
    labstate.save(st)
    labbuild.apply_fabrics(st, progress)
    nodes = st.nodes()
    accel = vm.accel()
    ttl = vm.lease_ttl(spec.options.lease_ttl, accel)
    if ttl != spec.options.lease_ttl and ttl is not None:
        st.lease_ttl = ttl
        labstate.save(st)
        progress(vm.EMULATED_LEASE_NOTE)
    args = vm.agent_args(spec.options.agent_args, accel)
    if args != spec.options.agent_args:
        st.agent_args = list(args)
        labstate.save(st)
        progress(vm.EMULATED_RESYNC_NOTE)
    progress(f"booting {len(nodes)} VM(s) ({accel}, {NODE_CPUS} vCPU, {NODE_MEMORY} each)")

    def boot(item: tuple[ClusterState, NodeState]) -> None:
        c, n = item
        assert n.vm is not None and n.kernel is not None  # _vm_node gave it both
        machine = vm.VM(vm.kernel(n.kernel), n.vm.name, workdir=Path(n.vm.workdir), cpus=NODE_CPUS,
                        memory=NODE_MEMORY, accel_mode=accel, netns=fab, nics=[(x.tap, x.mac) for x in n.nics])
        try:
            machine.start()  # its PIDs are in its vm.json from the moment QEMU starts (stop_vms)
        finally:
            _record(st, n, machine)
        progress(f"VM {n.name}: Debian {n.kernel} ({machine.kernel.version}) up in "
                 f"{machine.boot_seconds:.1f} s")
        _setup_guest(st, c, n, machine, spec)
        progress(f"node {n.name}: NICs, {len(n.pods)} pod(s) and its etcd identity in place")

    parallel(nodes, boot)


def _vm_node(spec: LabSpec, st: LabState, cst: ClusterState, cluster: str, n: Node, idx: int,
             subnets: list[IPNetwork]) -> NodeState:
    """Node `idx`'s taps on the lab's bridges and its entry in the host's state (its VM to come)."""
    fab = f"{st.prefix}fab"
    pub_ip = PUBLIC_NET.network_address + 10 + idx
    series = spec.options.kernel_of(n.name, cluster)
    key = f"{cluster}-{n.name}" if spec.multi else n.name
    nics = [(f"n{idx}u", _mac(idx, 0), "pub", "bpub")]
    if n.internal_ip is not None:
        nics.append((f"n{idx}p", _mac(idx, 1), "priv", f"bpriv{subnets.index(n.internal_ip.network)}"))
    for tap, _, _, br in nics:
        netns.run(fab, ["ip", "tuntap", "add", "mode", "tap", "name", tap])
        netns.enslave(fab, tap, br)
        netns.run(fab, ["ip", "link", "set", tap, "up"])
    d = vm_dir(st.name, key)
    guest_dir = labstate.lab_dir(st.name) / "node"  # in the guest's own /run: its key stays there
    return NodeState(
        name=n.name, netns=None, kernel=series, location=n.location, pod_cidrs=[str(c) for c in n.pod_cidrs],
        internal_ip=str(n.internal_ip) if n.internal_ip else None, public_ip=str(pub_ip),
        leader=n.leader, persistent_keepalive=n.persistent_keepalive,
        allowed_location_ips=[str(a) for a in n.allowed_location_ips],
        private_interface="priv" if n.internal_ip is not None else None, public_interface="pub",
        metrics_addr=f"{pub_ip}:{METRICS_PORT}", status_netns=cst.etcd.netns,
        dir=str(d / "shared" / "node"), state_dir=str(guest_dir / "state"), wg_run_dir=str(guest_dir / "wg"),
        pods=[pod_entry(f"{st.prefix}{key}-p{k}", n.pod_cidrs[:1], k) for k in range(spec.options.pods_per_node)],
        pid=None, guest_pid=None, agent_args=[], nat=None,
        nics=[NicState(tap=t, mac=m, name=r) for t, m, r, _ in nics],
        vm=VmRecord(name=f"{st.name}-{key}", series=series, workdir=str(d)),
    )


def _record(st: LabState, node: NodeState, machine: vm.VM) -> None:
    node.vm = machine.describe()
    labstate.save(st)


def machine_of(node: NodeState) -> vm.VM:
    """The running VM of a lab node; MeshError when it is gone."""
    if node.vm is None:
        raise MeshError(f"lab node {node.name} is not a VM node")
    machine = vm.VM.attach(node.vm)
    if not machine.alive():
        raise MeshError(f"the VM of lab node {node.name} is not running (meshctl lab down)")
    return machine


def guest_run(node: NodeState, ns: str | None, argv: list[str], timeout: float = 60
              ) -> subprocess.CompletedProcess[str]:
    """Run `argv` inside the VM of `node`, in its namespace `ns` there (None: the guest's root)."""
    full = [*netns.exec_prefix(ns), *argv]
    res = machine_of(node).run(full, timeout=timeout)
    return subprocess.CompletedProcess(full, res.rc, res.stdout, res.stderr)


def on_node(node: NodeState | None, ns: str | None, argv: list[str], timeout: float = 30
            ) -> subprocess.CompletedProcess[str]:
    """check.NodeRunner for any lab: in a VM node's guest, else here. Never raises on exit status."""
    if node is not None and node.vm is not None:
        return guest_run(node, ns, argv, timeout=timeout)
    return check.on_host(node, ns, argv, timeout)


def _guest_python(node: NodeState, *args: str, timeout: float = 300) -> str:
    out = guest_run(node, None, [sys.executable, "-m", "meshctl.lab.vms.vmnodes", *args], timeout=timeout)
    if out.returncode != 0:
        last = (out.stderr or out.stdout).strip().splitlines()
        raise MeshError(f"{' '.join(args[:1])} in the VM of {node.name} failed: "
                        f"{last[-1] if last else f'exit {out.returncode}'}")
    return out.stdout


def _ship(src: str | Path, dst_dir: Path) -> str:
    """Copy one credential into a VM's shared directory, private to root (0600)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / Path(src).name
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o600)
    return str(dst)


def _setup_guest(st: LabState, cst: ClusterState, node: NodeState, machine: vm.VM, spec: LabSpec) -> None:
    """Hand the guest what its node needs (its own etcd identity only, the clustermesh files
    naming this cluster's read-only identity in the others) and let it wire itself as a node."""
    creds = machine.shared / "creds"
    e = cst.etcd
    me = e.identities[node.name]
    mine = labstate.Identity(user=me.user, cert=_ship(me.cert, creds), key=_ship(me.key, creds),
                             password_file=_ship(me.password_file, creds))
    cm_dir = None
    if cst.clustermesh_dir:
        cm = machine.shared / "clustermesh"
        cm.mkdir(parents=True, exist_ok=True)
        for f in sorted(Path(cst.clustermesh_dir).iterdir()):
            doc = json.loads(f.read_text())
            sub = creds / f"remote-{f.name}"
            for k in ("ca-file", "cert-file", "key-file", "password-file"):
                if doc.get(k):
                    doc[k] = _ship(doc[k], sub)
            (cm / f.name).write_text(json.dumps(doc, indent=1) + "\n")
        cm_dir = str(cm)
    fabrics = {str(f.subnet): {"kind": f.kind, "network": f.network, "loss": f.loss} for f in spec.options.fabrics}
    assert node.kernel is not None  # a VM node's
    guest_state = LabState(
        name=st.name, prefix=st.prefix, source=st.source, created=time.time(), pin_root=st.pin_root,
        dir=str(labstate.lab_dir(st.name)), fastpath=st.fastpath, lease_ttl=st.lease_ttl,
        agent_args=list(st.agent_args), in_vm=InVm(node=node.name, series=node.kernel),
        clusters=[ClusterState(
            name=cst.name, id=cst.id, port=cst.port, mesh=dict(cst.mesh), clustermesh_dir=cm_dir,
            etcd=labstate.EtcdAccess(endpoints=list(e.endpoints), ca=_ship(e.ca, creds), cert=mine.cert, key=mine.key,
                                     user=mine.user, password_file=mine.password_file,
                                     identities={node.name: mine}, netns=None),
            nodes=[dataclasses.replace(node, vm=None, status_netns=None)],
        )],
    )
    bundle = {"state": labstate.to_json(guest_state), "node": node.name, "fabrics": fabrics,
              "public": f"{node.public_ip}/{PUBLIC_NET.prefixlen}"}
    path = machine.shared / GUEST_NODE_FILE
    path.write_text(json.dumps(bundle, indent=1))
    os.chmod(path, 0o600)
    _guest_python(node, "guest-setup", str(path))


def start_agent(st: LabState, node_name: str, *, extra_args: tuple[str, ...] = ()) -> int:
    """Start one node's agent: a VM node's inside its guest, its guest PID kept as `guest_pid`
    (never as `pid`: the host must not signal a number that means another process here); any
    other node's as the namespace lab does."""
    _, node = st.lookup(node_name)
    if node.vm is None:
        return labbuild.start_agent(st, node_name, extra_args=extra_args)
    pid = int(_guest_python(node, "guest-agent", "start", st.name, node.name, *extra_args).strip())
    node.guest_pid = pid
    labstate.save(st)
    return pid


def stop_agent(st: LabState, node_name: str, *, kill: bool = False) -> None:
    """Stop one node's agent, in its VM or as the namespace lab does."""
    _, node = st.lookup(node_name)
    if node.vm is None:
        labbuild.stop_agent(st, node_name, kill=kill)
        return
    _guest_python(node, "guest-agent", "kill" if kill else "stop", st.name, node.name)
    node.guest_pid = None
    labstate.save(st)


def start_all_agents(st: LabState, progress: Progress, hold: tuple[str, ...] = ()) -> None:
    """Start every agent but those in `hold`, all at once (each start is a round trip into a slow guest)."""
    todo = labbuild.agents_to_start(st, hold)
    parallel(todo, lambda key: start_agent(st, key))
    progress(f"started {len(todo)} agent(s)")


def stop_vms(name: str, st: LabState | None, progress: Progress) -> list[str]:
    """Stop every VM of lab `name`: those in its state and any whose vm.json is still under
    /run/meshctl-vm/<lab> (a lab that crashed before saving); each by its recorded PIDs."""
    descs = {n.vm.workdir: n.vm for _, n in (st.nodes() if st else []) if n.vm is not None}
    root = VM_ROOT / name
    if root.exists():
        for f in root.glob("*/vm.json"):
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                d = labstate.from_json(VmRecord, json.loads(f.read_text()))
                descs.setdefault(d.workdir, d)
    left: list[str] = []
    stopped = 0
    for d in descs.values():
        if not d.series:
            continue
        machine = vm.VM.attach(d)
        if machine.alive():
            stopped += 1
        machine.stop()
        left += [f"VM process {p}" for p in (machine.pid, machine.qemu_pid) if p and pid_alive(p)]
    if root.exists():
        shutil.rmtree(root, ignore_errors=True)
    if stopped:
        progress(f"stopped {stopped} VM(s) of lab {name}")
    return left


def down(name: str, *, progress: Progress = quiet) -> list[str]:
    """Remove a lab whose nodes may be VMs: its VMs first (a VM node's PIDs are its guest's), then
    everything the namespace lab's down removes; returns what could not be removed."""
    left = stop_vms(name, labstate.load(name), progress)
    for p in left:
        progress(f"warning: {p}")
    return left + labbuild.down(name, progress=progress)


# --- guest side --------------------------------------------------------------------------------


def _nic_by_mac(mac: str) -> str | None:
    for p in Path("/sys/class/net").iterdir():
        with contextlib.suppress(OSError):
            if (p / "address").read_text().strip().lower() == mac.lower():
                return p.name
    return None


def guest_setup(bundle_path: str) -> None:
    """Wire this VM as its lab node: NICs renamed `pub`/`priv` and addressed (the private one as its
    fabric says), forwarding on, the pods, and the one-node lab state the node's commands use."""
    b = json.loads(Path(bundle_path).read_text())
    st = labstate.from_json(LabState, b["state"])
    node = st.clusters[0].nodes[0]
    subprocess.run(["modprobe", "virtio_net"], check=False, capture_output=True)
    for nic in node.nics:
        dev = wait_for(functools.partial(_nic_by_mac, nic.mac), timeout=30, step=0.2)  # the driver may be probing
        if not dev:
            raise MeshError(f"no NIC with MAC {nic.mac} in this VM")
        if dev != nic.name:
            netns.run(None, ["ip", "link", "set", "dev", dev, "down"])
            netns.run(None, ["ip", "link", "set", "dev", dev, "name", nic.name])
        netns.run(None, ["ip", "link", "set", "dev", nic.name, "up"])
    netns.addr(None, "pub", b["public"])
    if node.internal_ip:
        fabs = fabric.parse_fabrics(b["fabrics"])
        node.agent_args = fabric.node_address(None, "priv", ipaddress.ip_interface(node.internal_ip), fabs)
    netns.sh(["bash", str(NODE_PREP)])
    os.makedirs(st.dir, exist_ok=True)
    for pod in node.pods:
        wire_pod(st, None, pod.netns, [ipaddress.ip_network(node.pods_cidr)], pod.index)
    labstate.save(st)


def forked_spawner(argv: list[str], *, log: int, env: dict[str, str]) -> int:
    """build.Spawner: in a guest, the agent forked from this interpreter, which (served by the
    guest's warm server, lab/vms/zygote.py) has imported it already, inside its node's namespace
    when the command names one; a new process for any other command, and anywhere outside a guest
    (where no warm server ran, nothing is forkable)."""
    netns_file, command = zygote.split_netns(argv)
    warm = zygote.forkable(command) if zygote.warm_here() else None
    if warm is None:
        return labbuild.popen_spawner(argv, log=log, env=env)
    return zygote.spawn(*warm, stdout=log, stderr=log, env=env, new_session=True, netns=netns_file)


def guest_agent(action: str, lab: str, node_name: str, extra: list[str]) -> None:
    """Start (printing its PID), stop or kill the agent of this VM's node."""
    st = labstate.resolve(lab)
    if action == "start":
        print(labbuild.start_agent(st, node_name, extra_args=tuple(extra), spawn=forked_spawner))
    else:
        labbuild.stop_agent(st, node_name, kill=action == "kill")


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "guest-setup":
            guest_setup(argv[1])
            return 0
        if len(argv) >= 4 and argv[0] == "guest-agent" and argv[1] in ("start", "stop", "kill"):
            guest_agent(argv[1], argv[2], argv[3], argv[4:])
            return 0
    except MeshError as e:
        print(str(e), file=sys.stderr)
        return 1
    print("usage: python -m meshctl.lab.vms.vmnodes guest-setup FILE | guest-agent start|stop|kill LAB NODE [ARGS]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

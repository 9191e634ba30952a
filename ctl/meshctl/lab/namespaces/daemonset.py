# SPDX-License-Identifier: Apache-2.0
"""The DaemonSet's pod as the lab runs it (`lab.agent: image`): manifests/04-daemonset.yaml read
itself, so a change to the manifest changes the lab, and turned into one `podman run` per container.

A lab node stands for a Kubernetes node: each container runs in the node's network namespace (what
`hostNetwork: true` gives a pod), with the container's command and arguments (`$(VAR)` expanded
from its environment as the kubelet does), its environment (`fieldRef` from the node, ConfigMap
keys from the ConfigMaps the caller hands over by name), its securityContext (privileged,
capabilities over the container runtime's default set, read-only root, user, no-new-privileges,
seccomp) and its memory limit.
Each hostPath volume is the node's own: a directory under the node's lab directory (`root/<path>`)
for state the node keeps, the host's own for what the kernel provides (devices, /lib/modules, /sys),
and for the bpffs a directory of the host's bpffs per node (each node has its own /sys/fs/bpf).

What is not done: probes other than a native sidecar's startup probe (which gates the next
container, as the kubelet's does), CPU and request resources, and volume kinds other than hostPath
(refused in one line naming the volume). The lab's own flags (its backend, etcd identity, pod CIDRs,
NICs, location) are added to the manifest's arguments: flags the manifest sets keep the manifest's
value, except those in LAB_WINS where the lab's differs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from meshctl.errors import InputError, MeshError

MANIFEST = Path(__file__).resolve().parents[4] / "manifests" / "04-daemonset.yaml"
# The lab's value wins over the manifest's for these flags where the two differ (an etcd lab runs
# its own backend; a Kubernetes lab keeps the manifest's, docs/lab.md).
LAB_WINS = ("--backend",)
# The capabilities a container gets from the runtime without a securityContext (containerd's and
# CRI-O's default set; podman's own default lacks NET_RAW, MKNOD and AUDIT_WRITE).
DEFAULT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
                "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE")
KERNEL_PATHS = ("/dev/", "/sys/", "/proc/", "/lib/modules")  # hostPaths the kernel provides: the host's own
BPFFS = "/sys/fs/bpf"
SECURITY_KEYS = ("privileged", "capabilities", "readOnlyRootFilesystem", "runAsUser", "runAsGroup",
                 "allowPrivilegeEscalation", "seccompProfile", "runAsNonRoot")
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
          "Ti": 2**40}


@dataclass(frozen=True)
class Mount:
    """One volumeMount with its hostPath volume."""

    volume: str
    path: str  # in the container
    host_path: str  # on a Kubernetes node
    host_type: str  # hostPath.type ("" unset)
    read_only: bool = False
    propagation: str = ""  # mountPropagation ("" none)


@dataclass(frozen=True)
class Probe:
    command: tuple[str, ...]
    period: float
    failures: int


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[Mapping[str, Any], ...]  # the manifest's entries, resolved per node by `environment`
    security: Mapping[str, Any]
    mounts: tuple[Mount, ...]
    memory_limit: int | None = None  # bytes
    startup: Probe | None = None  # a native sidecar's startup probe (exec)
    sidecar: bool = False  # an init container with restartPolicy Always


@dataclass(frozen=True)
class Pod:
    namespace: str
    containers: tuple[Container, ...]  # native sidecars first, then the containers, in order
    automount_token: bool = True  # spec.automountServiceAccountToken: the service account in every container

    def container(self, name: str) -> Container:
        for c in self.containers:
            if c.name == name:
                return c
        raise MeshError(f"the DaemonSet has no container {name}")


def load(path: Path | None = None) -> Pod:
    """The DaemonSet's pod from `path` (default MANIFEST; the first DaemonSet in it)."""
    path = path or MANIFEST
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except FileNotFoundError:
        raise MeshError(f"lab.agent image runs the DaemonSet of the checkout's manifests: {path} is missing") from None
    ds = next((d for d in docs if isinstance(d, dict) and d.get("kind") == "DaemonSet"), None)
    if ds is None:
        raise MeshError(f"{path} holds no DaemonSet")
    return parse(ds, path.name)


def parse(ds: Mapping[str, Any], where: str = "DaemonSet") -> Pod:
    spec = ds["spec"]["template"]["spec"]
    if spec.get("hostNetwork") is not True:
        raise InputError(f"{where}: spec.template.spec.hostNetwork", spec.get("hostNetwork"),
                         "is not true: the lab runs the pod in its node's network namespace")
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    init = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    plain_init = [c["name"] for c in spec.get("initContainers") or [] if c.get("restartPolicy") != "Always"]
    if plain_init:
        raise InputError(f"{where}: initContainers", plain_init, "are run-to-completion init containers, which the "
                         "lab does not run (only native sidecars)")
    out = [_container(c, volumes, where, sidecar=True) for c in init]
    out += [_container(c, volumes, where, sidecar=False) for c in spec.get("containers") or []]
    return Pod(namespace=ds.get("metadata", {}).get("namespace", "default"), containers=tuple(out),
               automount_token=spec.get("automountServiceAccountToken") is not False)


def _container(c: Mapping[str, Any], volumes: Mapping[str, Any], where: str, *, sidecar: bool) -> Container:
    name = c["name"]
    mounts = []
    for m in c.get("volumeMounts") or []:
        v = volumes.get(m["name"])
        if v is None or "hostPath" not in v:
            raise InputError(f"{where}: volume {m['name']}", None if v is None else sorted(set(v) - {"name"}),
                             "is not a hostPath volume, the only kind the lab runs")
        mounts.append(Mount(volume=m["name"], path=m["mountPath"], host_path=v["hostPath"]["path"],
                            host_type=v["hostPath"].get("type", ""), read_only=bool(m.get("readOnly")),
                            propagation=m.get("mountPropagation", "")))
    probe = None
    sp = c.get("startupProbe")
    if sidecar and sp:
        if "exec" not in sp:
            raise InputError(f"{where}: {name}.startupProbe", sorted(sp), "is not an exec probe")
        probe = Probe(tuple(sp["exec"]["command"]), float(sp.get("periodSeconds", 10)),
                      int(sp.get("failureThreshold", 3)))
    limit = (c.get("resources") or {}).get("limits", {}).get("memory")
    return Container(name=name, image=c["image"], command=tuple(c.get("command") or ()),
                     args=tuple(c.get("args") or ()), env=tuple(c.get("env") or ()),
                     security=c.get("securityContext") or {}, mounts=tuple(mounts),
                     memory_limit=quantity(limit, f"{where}: {name}.resources.limits.memory") if limit else None,
                     startup=probe, sidecar=sidecar)


def quantity(value: Any, path: str) -> int:
    """A Kubernetes quantity of bytes (`512Mi`, `1G`, `1000`)."""
    m = re.fullmatch(r"(\d+)([kMGT]i?|Ki)?", str(value))
    if not m or (m.group(2) or "") not in _UNITS:
        raise InputError(path, value, "is not a Kubernetes quantity of bytes")
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: a defined variable's value, an undefined one left as
    written, `$$` a literal `$`."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(sub, text)


def environment(c: Container, fields: Mapping[str, str], config: Mapping[str, Mapping[str, str]],
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The container's environment: `base` (what the kubelet sets in every container, such as
    KUBERNETES_SERVICE_HOST), then `value`s (expanded), `fieldRef`s from `fields` (fieldPath ->
    value: spec.nodeName, status.hostIP, ...), `configMapKeyRef`s from `config` (ConfigMap name ->
    its data; a missing optional key or ConfigMap leaves the variable out, as the kubelet does)."""
    out: dict[str, str] = dict(base or {})
    for e in c.env:
        name = e["name"]
        if "value" in e:
            out[name] = expand(str(e["value"]), out)
            continue
        src = e.get("valueFrom") or {}
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            if path not in fields:
                raise InputError(f"{c.name}.env.{name}.valueFrom.fieldRef.fieldPath", path,
                                 f"is not a field the lab fills ({', '.join(sorted(fields))})")
            out[name] = fields[path]
        elif "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            data = config.get(ref.get("name", ""), {})
            if ref["key"] in data:
                out[name] = data[ref["key"]]
            elif not ref.get("optional"):
                raise InputError(f"{c.name}.env.{name}.valueFrom.configMapKeyRef.key", ref["key"],
                                 f"is not a key of ConfigMap {ref.get('name', '')} and not optional")
        else:
            raise InputError(f"{c.name}.env.{name}.valueFrom", sorted(src), "is not a fieldRef or configMapKeyRef")
    return out


def merge_args(manifest: Sequence[str], lab: Sequence[str]) -> list[str]:
    """The manifest's arguments, then the lab's flags the manifest does not set; for a flag in
    LAB_WINS a different value of the lab's replaces the manifest's (an equal one keeps the
    manifest's spelling). Flags are `--x=v`, `--x v` (a value never
    starts with `--`) or a lone `--flag`; other words (the `agent` command) stay where they are."""
    def split(argv: Sequence[str]) -> list[list[str]]:
        items: list[list[str]] = []
        for a in argv:
            last = items[-1] if items else [""]
            if len(last) == 1 and last[0].startswith("--") and "=" not in last[0] and not a.startswith("--"):
                items[-1].append(a)
            else:
                items.append([a])
        return items

    def flag(item: list[str]) -> str | None:
        return item[0].split("=", 1)[0] if item[0].startswith("--") else None

    def value(item: list[str]) -> str | None:
        return item[0].split("=", 1)[1] if "=" in item[0] else (item[1] if len(item) > 1 else None)

    ours = split(lab)
    theirs = split(manifest)
    manifest_values = {flag(i): value(i) for i in theirs if flag(i)}
    # the lab's flags in LAB_WINS whose value differs from the manifest's replace it
    wins = {flag(i) for i in ours if flag(i) in LAB_WINS and manifest_values.get(flag(i), value(i)) != value(i)}
    kept = [i for i in theirs if flag(i) not in wins]
    added = [i for i in ours if flag(i) not in manifest_values or flag(i) in wins]
    return [a for i in kept + added for a in i]


def security_options(sc: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """podman options for a securityContext, and warnings for what the lab does not apply."""
    opts: list[str] = []
    warnings = [f"securityContext.{k} is not applied by the lab" for k in sc if k not in SECURITY_KEYS]
    caps = sc.get("capabilities") or {}
    if sc.get("privileged"):
        opts.append("--privileged")
    else:
        dropped = {c.upper() for c in caps.get("drop") or []}
        opts += ["--cap-drop", "all"]
        keep = [] if "ALL" in dropped else [c for c in DEFAULT_CAPS if c not in dropped]
        for cap in [*keep, *(c.upper() for c in caps.get("add") or [])]:
            opts += ["--cap-add", cap]
    if sc.get("readOnlyRootFilesystem"):
        opts.append("--read-only")
    if "runAsUser" in sc:
        opts += ["--user", f"{sc['runAsUser']}" + (f":{sc['runAsGroup']}" if "runAsGroup" in sc else "")]
    if sc.get("allowPrivilegeEscalation") is False:
        opts += ["--security-opt", "no-new-privileges"]
    seccomp = (sc.get("seccompProfile") or {}).get("type", "Unconfined")  # the kubelet's default: unconfined
    if seccomp == "Unconfined":
        opts += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        warnings.append(f"securityContext.seccompProfile.type {seccomp} is not applied by the lab (runtime default)")
    return opts, warnings


def host_path(m: Mount, node_root: str, node_bpffs: str) -> str:
    """Where a lab node keeps a hostPath of the manifest: the node's bpffs folder for /sys/fs/bpf,
    the host's own for what the kernel provides, else under the node's root folder."""
    p = m.host_path.rstrip("/") or "/"
    if p == BPFFS or p.startswith(BPFFS + "/"):
        return node_bpffs + p[len(BPFFS):]
    if p.startswith(KERNEL_PATHS) or p == "/lib/modules":
        return p
    return node_root.rstrip("/") + p


def container_to_host(pod: Pod, path: str, node_root: str, node_bpffs: str) -> str | None:
    """The host path behind a container path of any container of the pod (through its mounts),
    None when no mount holds it."""
    best: tuple[int, str] | None = None
    for c in pod.containers:
        for m in c.mounts:
            mp = m.path.rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                host = host_path(m, node_root, node_bpffs) + path[len(mp):]
                if best is None or len(mp) > best[0]:
                    best = (len(mp), host)
    return best[1] if best else None

# SPDX-License-Identifier: Apache-2.0
"""Field parsers shared by every input: topology files, etcd records, Kubernetes annotations,
remote clusters and the agent's flags. Each parser takes the value and the path that names it
and raises `InputError(path, value, reason)`, so every bad input reads the same way:
`nodes[2].pod_cidr: '10.42.1.0/33' is not a CIDR`.
"""

from __future__ import annotations

import base64
import difflib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast

from meshctl.errors import MISSING, InputError
from meshctl.mesh.model import (
    GRANULARITIES,
    WIREGUARD_ADDRESSINGS,
    Endpoint,
    Granularity,
    IPInterface,
    IPNetwork,
    KeyRef,
    WireGuardAddressing,
    interned,
)

T = TypeVar("T", IPNetwork, IPInterface, Endpoint)

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")
_LOCATION = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")


def is_digits(value: Any) -> bool:
    """A non-empty string of ASCII digits (`str.isdigit` also accepts '²', which `int` refuses)."""
    return isinstance(value, str) and value.isascii() and value.isdigit()


def node_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or len(value) > 253 or not _DNS1123.match(value):
        raise InputError(path, value, "is not a DNS-1123 name")
    return value


def cluster_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _CLUSTER_NAME.match(value):
        raise InputError(path, value, "is not a cluster name (lowercase alnum and '-', 1-32 chars)")
    return value


def integer(value: Any, path: str, low: int, high: int, reason: str) -> int:
    """The one rule for every whole-number field: an int, or a string of ASCII digits (`"51820"`:
    annotations and ConfigMaps carry only strings, and a quoted YAML number means the same), within
    low..high; never a bool or a float. The error shows the value as written."""
    n = int(value) if is_digits(value) else value
    if isinstance(n, bool) or not isinstance(n, int) or not low <= n <= high:
        raise InputError(path, value, reason)
    return n


def cluster_id(value: Any, path: str) -> int:
    return integer(value, path, 1, 255, "is not a cluster id in 1..255")


def one_of(value: Any, path: str, choices: tuple[str, ...]) -> str:
    """A field whose value is one of a few names (a mode): the error lists them."""
    if value not in choices:
        raise InputError(path, value, f"is not one of {', '.join(choices)}")
    return cast(str, value)


def granularity(value: Any, path: str) -> Granularity:
    return cast(Granularity, one_of(value, path, GRANULARITIES))


def wireguard_addressing(value: Any, path: str) -> WireGuardAddressing:
    return cast(WireGuardAddressing, one_of(value, path, WIREGUARD_ADDRESSINGS))


def location(value: Any, path: str) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not _LOCATION.match(value):
        raise InputError(path, value, "is not a location name")
    return value


def cidr(value: Any, path: str) -> IPNetwork:
    """A network with its host bits zero."""
    if not isinstance(value, str) or "/" not in value:
        raise InputError(path, value, "is not a CIDR")
    _no_zone(value, path)
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise InputError(path, value, "is not a CIDR") from None


def _no_zone(value: str, path: str) -> None:
    """IPv6 zone indexes (`fe80::1%eth0`) name an interface of one host: meaningless in a record
    other nodes read, and `ipaddress` would keep them inside the address."""
    if "%" in value:
        raise InputError(path, value, "has a zone index (%...): write the address without it")


def network(value: Any, path: str) -> IPNetwork:
    """A CIDR that must be a network address (host bits zero)."""
    net = cidr(value, path)
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise InputError(path, value, f"has host bits set (the network is {net})") from None
    return interned(net)


def interface(value: Any, path: str) -> IPInterface:
    """An address with its prefix (`10.10.0.4/24`): the prefix is the private subnet."""
    if not isinstance(value, str) or "/" not in value:
        raise InputError(path, value, "is not an address with a prefix (like 10.10.0.4/24)")
    _no_zone(value, path)
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError:
        raise InputError(path, value, "is not an address with a prefix (like 10.10.0.4/24)") from None
    if iface.ip.is_multicast or iface.ip.is_unspecified:
        raise InputError(path, value, "is not a unicast address")
    return iface


def port(value: Any, path: str) -> int:
    return integer(value, path, 1, 65535, "is not a port in 1..65535")


def endpoint(value: Any, path: str, default_port: int | None = None) -> Endpoint:
    """`host:port`, `[v6]:port` or `dns-name:port` (the port may be left out if a default is given)."""
    if not isinstance(value, str) or not value:
        raise InputError(path, value, "is not an endpoint (host:port, [v6]:port or name:port)")
    _no_zone(value, path)
    host: str
    port_text: str | None
    if value.startswith("["):
        m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", value)
        if not m:
            raise InputError(path, value, "is not an endpoint (host:port, [v6]:port or name:port)")
        host, port_text = m.group(1), m.group(2)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise InputError(path, value, "is not an endpoint: bad IPv6 address") from None
    else:
        if value.count(":") > 1:
            raise InputError(path, value, "is not an endpoint: write IPv6 as [addr]:port")
        host, _, port_text = value.partition(":")
        port_text = port_text or None
        if not host:
            raise InputError(path, value, "is not an endpoint: no host")
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            if not _HOSTNAME.match(host) or re.fullmatch(r"[\d.]+", host):
                raise InputError(path, value, "is not an endpoint: bad host") from None
    if port_text is None:
        if default_port is None:
            raise InputError(path, value, "is not an endpoint: no port")
        return Endpoint(host, default_port)
    try:
        p = int(port_text)
    except ValueError:
        raise InputError(path, value, "is not an endpoint: bad port") from None
    if not 1 <= p <= 65535:
        raise InputError(path, value, "is not an endpoint: port outside 1..65535")
    return Endpoint(host, p)


def wg_key(value: Any, path: str) -> str:
    """A WireGuard key: standard base64 of exactly 32 bytes."""
    if not isinstance(value, str) or len(value) != 44:
        raise InputError(path, _redact(value), "is not a WireGuard key (base64 of 32 bytes)")
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        raise InputError(path, _redact(value), "is not a WireGuard key (base64 of 32 bytes)") from None
    if len(raw) != 32:
        raise InputError(path, _redact(value), "is not a WireGuard key (base64 of 32 bytes)")
    return value


def _redact(value: Any) -> Any:
    # Keys are public here, but a long string in an error line helps no one.
    return value if not isinstance(value, str) or len(value) <= 60 else value[:20] + "..."


def keepalive(value: Any, path: str) -> int:
    if value is None:
        return 0
    return integer(value, path, 0, 65535, "is not a keepalive in seconds (0..65535)")


def boolean(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", ""):
        return value.lower() == "true"
    raise InputError(path, value, "is not true or false")


def cidr_list(value: Any, path: str) -> tuple[IPNetwork, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise InputError(path, value, "is not a list of CIDRs")
    return tuple(network(v, f"{path}[{i}]") for i, v in enumerate(value))


def pod_cidrs(value: Any, path: str, one_per_family: bool = True) -> tuple[IPNetwork, ...]:
    """A record's pod CIDRs: a non-empty list (or comma-separated string) of networks, at most
    one per IP family when `one_per_family` (a person's record, a Kubernetes Node's podCIDRs:
    one range per family); a CNI's IPAM may hand a node several blocks of one family."""
    nets = cidr_list(value, path)
    if not nets:
        raise InputError(path, value, "is empty (a node needs a pod CIDR)")
    return one_per_family_of(nets, path) if one_per_family else nets


def one_per_family_of(nets: tuple[T, ...], path: str, what: str = "pod CIDR") -> tuple[T, ...]:
    """`nets` when they hold at most one item per IP family; else InputError at the second (`what`
    names the kind: pod CIDR, internal address, endpoint)."""
    seen: dict[int, T] = {}
    for i, n in enumerate(nets):
        fam = n.family if isinstance(n, Endpoint) else n.version
        if fam in seen:
            kind = f"IPv{fam}" if fam else "DNS-name"
            raise InputError(f"{path}[{i}]", str(n), f"is a second {kind} {what} (after {seen[fam]}): one per family")
        seen[fam] = n
    return nets


def _items(value: Any, path: str, what: str) -> list[Any]:
    """A list field as a list (a comma-separated string is read as one), never empty."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise InputError(path, value, f"is not a list of {what}")
    if not value:
        raise InputError(path, value, "is empty (leave the field out for none)")
    return value


def interfaces(value: Any, path: str, what: str) -> tuple[IPInterface, ...]:
    """`internal_ips` / `wireguard_ips`: addresses with their prefix, at most one per family."""
    items = _items(value, path, "addresses with a prefix")
    return one_per_family_of(tuple(interface(v, f"{path}[{i}]") for i, v in enumerate(items)), path, what)


def endpoints(value: Any, path: str, default_port: int | None = None) -> tuple[Endpoint, ...]:
    """`endpoints`: at most one IPv4, one IPv6 and one DNS-name endpoint."""
    items = _items(value, path, "endpoints")
    return one_per_family_of(tuple(endpoint(v, f"{path}[{i}]", default_port) for i, v in enumerate(items)),
                             path, "endpoint")


def mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(path, value, "is not a mapping")
    return value


def no_unknown_fields(d: Mapping[Any, Any], known: Iterable[str], path: str) -> None:
    """Refuse the first key of `d` not in `known`. The line names the key, never its value (a
    misspelt `nodes:` would otherwise print the whole node list), and the nearest known field."""
    names = tuple(known)
    for k in d:
        if k not in names:
            raise unknown_field(k, names, path)


def unknown_field(key: Any, known: Iterable[str], path: str) -> InputError:
    """`nodes[0].podcidr: is not a known field (did you mean pod_cidr?)`."""
    by_lower = {k.lower(): k for k in known}  # `podCIDR` and `allowedips` find their field too
    close = difflib.get_close_matches(str(key).lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f" (did you mean {by_lower[close[0]]}?)" if close else ""
    where = f"{path}.{key}" if path else str(key)
    return InputError(where, MISSING, f"is not a known field{hint}")


def key_file(value: Any, path: str) -> KeyRef:
    """A pre-shared key's file on the node: an absolute path (the key stays in the file)."""
    if not isinstance(value, str) or not value.startswith("/") or "\n" in value:
        raise InputError(path, value, "is not an absolute path of a key file")
    return KeyRef("file", value)


def secret_key_ref(value: Any, path: str) -> KeyRef:
    """`{secretKeyRef: {name, key}}`: a key of a Secret in the agent's namespace. A string here is
    a key written into the spec (Kilo's form): refused, and never repeated in the error."""
    if isinstance(value, str):
        raise InputError(path, "(hidden)", "is a key written in the spec: keep it in a Secret and give "
                         "{secretKeyRef: {name, key}}")
    ref = value.get("secretKeyRef") if isinstance(value, Mapping) else None
    if not isinstance(ref, Mapping):
        raise InputError(path, value, "is not {secretKeyRef: {name, key}}")
    name = node_name(ref.get("name"), f"{path}.secretKeyRef.name")
    key = ref.get("key")
    if not isinstance(key, str) or not re.fullmatch(r"[-._A-Za-z0-9]{1,253}", key):
        raise InputError(f"{path}.secretKeyRef.key", key, "is not a Secret key name")
    return KeyRef("secret", name, key)


MAX_DISCOVERED = 4096  # entries in one record's discovered_endpoints / unreached_peers


def discovered_endpoints(value: Any, path: str, owner: str) -> tuple[tuple[str, Endpoint], ...]:
    """`{peer: "ip:port"}`: where `owner` saw each peer's latest handshake come from. A peer is a
    node name or its WireGuard public key (Kilo's annotation keys them so). Only IP literals (a
    handshake has a source address, never a name) and never the owner itself."""
    if value is None:
        return ()
    d = mapping(value, path)
    if len(d) > MAX_DISCOVERED:
        raise InputError(path, f"{len(d)} entries", f"is more than {MAX_DISCOVERED} entries")
    out = []
    for name, ep_text in d.items():
        if not (isinstance(name, str) and len(name) == 44 and name.endswith("=")):
            node_name(name, f"{path}.{name}")
        else:
            wg_key(name, f"{path}.{name}")
        if name == owner:
            raise InputError(f"{path}.{name}", ep_text, "is the node's own name (a node cannot discover itself)")
        ep = endpoint(ep_text, f"{path}.{name}")
        if ep.ip is None:
            raise InputError(f"{path}.{name}", ep_text, "is not an IP address and port")
        out.append((name, ep))
    return tuple(sorted(out))


def name_list(value: Any, path: str, owner: str) -> tuple[str, ...]:
    """A list of node names other than `owner` (unreached_peers)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(path, value, "is not a list of node names")
    if len(value) > MAX_DISCOVERED:
        raise InputError(path, f"{len(value)} entries", f"is more than {MAX_DISCOVERED} entries")
    for i, name in enumerate(value):
        node_name(name, f"{path}[{i}]")
        if name == owner:
            raise InputError(f"{path}[{i}]", name, "is the node's own name")
    return tuple(sorted(set(value)))


def global_cidrs(value: Any, path: str) -> tuple[tuple[IPNetwork, IPNetwork], ...]:
    """`mesh.global_cidrs`: each pod range of the cluster with its global range, as a mapping
    (`{10.42.0.0/16: 10.142.0.0/16}`) or, as `mesh set` writes it, comma-separated
    `POD=GLOBAL` pairs. Each global range is of the pod range's family and size; one pair per
    family; no range of the setting overlaps another (a global range inside a pod range would
    make an address mean two pods)."""
    if value is None or value == "" or value == {}:
        return ()
    if isinstance(value, str):
        pairs: list[tuple[Any, Any]] = []
        for item in (v.strip() for v in value.split(",") if v.strip()):
            left, sep, right = item.partition("=")
            if not sep:
                raise InputError(path, item, "is not POD=GLOBAL (a pod range, '=', its global range)")
            pairs.append((left.strip(), right.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise InputError(path, value, "is not a mapping of pod range to global range")
    out: list[tuple[IPNetwork, IPNetwork]] = []
    for pod_text, glob_text in pairs:
        where = f"{path}[{pod_text}]"
        pod = network(pod_text, f"{path} key")
        glob = network(glob_text, where)
        if glob.version != pod.version:
            raise InputError(where, glob_text, f"is not an IPv{pod.version} range like the pod range {pod}")
        if glob.prefixlen != pod.prefixlen:
            raise InputError(where, glob_text, f"is not the size of the pod range {pod} (a /{pod.prefixlen}: each "
                             "pod keeps its host bits in its global image)")
        if glob.prefixlen == 0:
            raise InputError(where, glob_text, "is a default route, not a range")
        if any(p.version == pod.version for p, _ in out):
            first = next(p for p, _ in out if p.version == pod.version)
            raise InputError(f"{path} key", pod_text, f"is a second IPv{pod.version} pod range (after {first}): "
                             "one per family")
        out.append((pod, glob))
    for i, (pod, glob) in enumerate(out):
        for j, (pod2, glob2) in enumerate(out):
            if glob.overlaps(pod2):
                raise InputError(f"{path}[{pod}]", str(glob), f"overlaps the pod range {pod2}")
            if i != j and glob.overlaps(glob2):
                raise InputError(f"{path}[{pod}]", str(glob), f"overlaps the global range {glob2} of {pod2}")
    return tuple(out)

# SPDX-License-Identifier: Apache-2.0
"""`meshctl plan|graph|showconf|mesh get --kubeconfig K` against a real kube-apiserver
(tests/kubernetes.py): the live cluster's Nodes and Peers give the same plan as a topology file with
the same records, with no Kilo CRD (or no CRD at all) installed; `showconf node X --as-peer -o yaml`
is a Peer a second cluster's API server accepts and its backend admits; and every failure a user
can meet (a stopped API server, a wrong CA, a token without rights, a bad token, a server that is
not a Kubernetes API, Nodes whose agents have not published) is one line naming the server."""

from __future__ import annotations

import http.server
import json
import re
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from lightkube import Client
from lightkube.generic_resource import create_global_resource

from meshctl.backends.kube.backend import backend_from_options
from meshctl.cli import main
from meshctl.lab.rigs import pki
from meshctl.lab.rigs.kube_control_plane import write_kubeconfig
from tests.kubernetes import Api, start_control_plane

from .helpers import create_node, node_obj, wg_key

pytestmark = pytest.mark.slow

NODES = [
    # name, pod CIDR, key seed, internal, endpoint, location
    ("n1", "10.42.1.0/24", 1, "10.0.1.1/24", "198.51.100.1:51820", "fsn"),
    ("n2", "10.42.2.0/24", 2, "10.0.1.2/24", "198.51.100.2:51820", "fsn"),
    ("n3", "10.42.3.0/24", 3, "10.0.2.3/24", "198.51.100.3:51820", "hel"),
]
Peer = create_global_resource("meshctl.io", "v1alpha1", "Peer", "peers")
# The read-only commands of issue 34: each reads the whole cluster through the backend.
READERS = [pytest.param(["plan", "--node", "n1"], id="plan"), pytest.param(["graph"], id="graph"),
           pytest.param(["showconf", "node", "n1"], id="showconf"), pytest.param(["mesh", "get"], id="mesh-get")]


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def fill(c: Client) -> None:
    for name, pod, seed, internal, ep, loc in NODES:
        create_node(c, node_obj(name, pod, key=seed, internal=internal, endpoint=ep,
                                labels={"topology.kubernetes.io/region": loc}))
    c.create(Peer.from_dict({"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": "laptop"},
                             "spec": {"publicKey": wg_key(9), "allowedIPs": ["10.5.0.1/32"]}}))


def same_topology_file(tmp_path: Path) -> str:
    doc = {"cluster": {"name": "default", "id": 1}, "mesh": {"granularity": "location"},
           "nodes": [{"name": n, "pod_cidr": pod, "public_key": wg_key(seed), "internal_ip": internal, "endpoint": ep,
                      "location": loc} for n, pod, seed, internal, ep, loc in NODES],
           "peers": [{"name": "laptop", "public_key": wg_key(9), "allowed_ips": ["10.5.0.1/32"]}]}
    f = tmp_path / "topo.yaml"
    f.write_text(yaml.safe_dump(doc))
    return str(f)


def crds(api: Api) -> set[str]:
    return {c["metadata"]["name"] for c in
            api.cp.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]}


def test_plan_from_the_api_equals_plan_from_the_file(api: Api, kclient: Client, tmp_path: Path) -> None:
    assert "peers.kilo.squat.ai" not in crds(api)  # a cluster that never ran Kilo
    fill(kclient)
    f = same_topology_file(tmp_path)
    for node in ("n1", "n2", "n3"):
        live = cli("plan", "--kubeconfig", api.kubeconfig, "--node", node, "-o", "json")
        assert live.exit_code == 0 and not live.stderr, live.output
        offline = cli("plan", "-f", f, "--node", node, "-o", "json")
        assert json.loads(live.stdout) == json.loads(offline.stdout)
    # --backend kubernetes said or implied by --kubeconfig: the same
    live = cli("plan", "--backend", "kubernetes", "--kubeconfig", api.kubeconfig, "--node", "n1", "-o", "json")
    assert json.loads(live.stdout) == json.loads(cli("plan", "-f", f, "--node", "n1", "-o", "json").stdout)
    live = cli("graph", "--kubeconfig", api.kubeconfig)
    assert live.exit_code == 0 and not live.stderr and live.stdout == cli("graph", "-f", f).stdout
    live = cli("showconf", "--kubeconfig", api.kubeconfig, "node", "n3")
    assert live.exit_code == 0 and live.stdout == cli("showconf", "-f", f, "node", "n3").stdout
    live = cli("mesh", "get", "--kubeconfig", api.kubeconfig, "-o", "json")
    assert live.exit_code == 0 and not live.stderr and json.loads(live.stdout)["granularity"] == "location"


def test_kubeconfig_from_the_environment(api: Api, kclient: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--backend kubernetes` finds the kubeconfig as kubectl does ($KUBECONFIG)."""
    fill(kclient)
    monkeypatch.setenv("KUBECONFIG", api.kubeconfig)
    r = cli("plan", "--backend", "kubernetes", "--node", "n1", "-o", "json")
    assert r.exit_code == 0, r.output
    assert sorted(p["name"] for p in json.loads(r.stdout)["peers"]) == ["laptop", "n3"]


def test_rejected_records_are_warnings_and_the_rest_plans(api: Api, kclient: Client) -> None:
    fill(kclient)
    create_node(kclient, node_obj("thief", "10.42.9.0/24", key=1, internal="10.0.1.9/24"))  # n1's key
    r = cli("plan", "--kubeconfig", api.kubeconfig, "--node", "n1", "-o", "json")
    assert r.exit_code == 0, r.output
    assert f"warning: rejected thief: nodes[3].public_key: {wg_key(1)!r} is already the key of node n1" in r.stderr
    assert "thief" not in r.stdout
    # Live records get the file's warnings too: a node nobody can reach and a peer that never calls.
    create_node(kclient, node_obj("n4", "10.42.4.0/24", key=4))
    r = cli("plan", "--kubeconfig", api.kubeconfig, "--node", "n1", "-o", "json")
    assert ("warning: kubernetes: node n4 and peer laptop: neither has an endpoint, so the WireGuard tunnel between "
            "them can never start (give one an endpoint)") in r.stderr.splitlines()


def test_as_peer_yaml_applies_in_a_second_cluster(api: Api, kclient: Client, own_kube: Api) -> None:
    fill(kclient)
    r = cli("showconf", "--kubeconfig", api.kubeconfig, "node", "n2", "--as-peer", "-o", "yaml",
            "--allowed-ips", "10.43.0.0/16")
    assert r.exit_code == 0, r.output
    other = own_kube  # the second cluster: a control plane of its own
    c2 = other.client()
    try:
        c2.create(Peer.from_dict(yaml.safe_load(r.stdout)))  # the CRD's schema on the real server takes it
        create_node(c2, node_obj("m1", "10.52.1.0/24", key=21, endpoint="203.0.113.21:51820"))
    finally:
        c2._client._client.close()
    be = backend_from_options(other.kubeconfig, "m1")
    try:
        st = be.snapshot()
    finally:
        be.close()
    assert st.ready and not st.rejections
    (peer,) = st.peers
    # n2 does not lead fsn: the Peer is fsn's segment under its leader n1, with the extra CIDR.
    assert peer.name == "default-n1" and peer.public_key == wg_key(1)
    assert str(peer.endpoint) == "198.51.100.1:51820"
    assert [str(a) for a in peer.allowed_ips] == ["10.0.1.1/32", "10.0.1.2/32", "10.4.0.1/32", "10.42.1.0/24",
                                                  "10.42.2.0/24", "10.43.0.0/16"]
    # ... and the second cluster's node plans a WireGuard peer to it.
    plan = json.loads(cli("plan", "--kubeconfig", other.kubeconfig, "--node", "m1", "-o", "json").stdout)
    assert [(p["name"], p["kind"], p["endpoint"]) for p in plan["peers"]] == \
        [("default-n1", "peer", "198.51.100.1:51820")]


def test_mesh_set_writes_the_configmap_and_mesh_get_reads_it(api: Api, kclient: Client, tmp_path: Path) -> None:
    from lightkube.resources.core_v1 import ConfigMap

    fill(kclient)
    f = same_topology_file(tmp_path)
    other = yaml.safe_load(Path(f).read_text())
    other["mesh"] = {"granularity": "full", "port": 51999}
    g = tmp_path / "full.yaml"
    g.write_text(yaml.safe_dump(other))
    live = ("--kubeconfig", api.kubeconfig)
    dry = cli("mesh", "set", "--dry-run", "granularity=full", "port=51999", *live, "-o", "json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout) == json.loads(cli("plan", "-f", f, "--diff", str(g), "-o", "json").stdout)
    assert json.loads(cli("mesh", "get", *live, "-o", "json").stdout)["granularity"] == "location"  # nothing written
    r = cli("mesh", "set", "granularity=full", "port=51999", *live)
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "wrote configmap meshctl/meshctl", r.output
    assert kclient.get(ConfigMap, "meshctl", namespace="meshctl").data == {"granularity": "full", "port": "51999"}
    got = json.loads(cli("mesh", "get", *live, "-o", "json").stdout)
    assert (got["granularity"], got["port"], got["intra_subnet"]) == ("full", 51999, "auto")
    r = cli("mesh", "set", "intra_subnet=vxlan", *live)  # a second write merges into the ConfigMap
    assert r.exit_code == 0, r.output
    assert kclient.get(ConfigMap, "meshctl", namespace="meshctl").data == {
        "granularity": "full", "port": "51999", "intra_subnet": "vxlan"}
    assert cli("mesh", "set", "granularity=full", "--lab", "x", "--backend", "kubernetes", *live).stderr == (
        "error: --lab: 'x' reads a lab's etcd: leave out --backend kubernetes\n")
    # --kubeconfig implies the Kubernetes backend: beside --lab it is refused too, never ignored
    for args in (("mesh", "set", "granularity=full"), ("mesh", "get"), ("plan", "--node", "n1")):
        r = cli(*args, "--lab", "x", *live)
        assert (r.exit_code, r.stderr) == (2, "error: --lab: 'x' reads a lab's etcd: leave out --kubeconfig\n"), args


# --- every failure one line -------------------------------------------------------------------------


def one_line_error(r: Result, server: str) -> str:
    """The one `error:` line of a failed command that names `server`; no traceback, nothing else."""
    assert r.exit_code != 0, r.output
    assert isinstance(r.exception, SystemExit), f"{r.exception!r} escaped"  # a traceback otherwise
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert server in lines[0], lines[0]
    assert "Traceback" not in r.output
    return lines[0]


def test_no_crd_at_all_then_a_stopped_api_server(tmp_path: Path) -> None:
    """A cluster where neither Kilo's nor meshctl's Peer CRD is installed plans (Peers are optional);
    then its API server stops: connection refused, with the hint for a k3s.yaml copied off a server."""
    cp = start_control_plane(tmp_path / "kt-nocrd", manifests=("00-namespace.yaml",))
    try:
        api = Api(cp)
        assert not {"peers.meshctl.io", "peers.kilo.squat.ai"} & crds(api)
        c = api.client()
        try:
            for name, pod, seed, internal, ep, loc in NODES:
                create_node(c, node_obj(name, pod, key=seed, internal=internal, endpoint=ep,
                                        labels={"topology.kubernetes.io/region": loc}))
        finally:
            c._client._client.close()
        for args in READERS:
            r = cli(*args.values[0], "--kubeconfig", api.kubeconfig)
            assert r.exit_code == 0 and not r.stderr, (args.id, r.output)
        plan = json.loads(cli("plan", "--kubeconfig", api.kubeconfig, "--node", "n1", "-o", "json").stdout)
        assert [p["name"] for p in plan["peers"]] == ["n3"]
        cp.stop_apiserver()
        for args in READERS:
            line = one_line_error(cli(*args.values[0], "--kubeconfig", api.kubeconfig), cp.url)
            assert "connection refused" in line and line.count("connection refused") == 1, line
            assert "a k3s.yaml copied from a server needs `server:` set to its address" in line, line
    finally:
        cp.stop()


@pytest.mark.parametrize("args", READERS)
def test_a_wrong_ca_is_one_line(api: Api, tmp_path: Path, args: list[str]) -> None:
    other = pki.make_ca(tmp_path / "kt-other-ca", "kt-other-ca")
    admin = api.cp.admin_identity()
    kc = write_kubeconfig(tmp_path / "wrong-ca.kubeconfig", api.url, other.cert, user="admin", cert=admin.cert,
                          key=admin.key)
    line = one_line_error(cli(*args, "--kubeconfig", str(kc)), api.url)
    assert "TLS: unable to get local issuer certificate (is the kubeconfig's certificate-authority this " \
           "cluster's CA?)" in line, line


@pytest.fixture
def no_rights_token(api: Api, tmp_path: Path) -> Path:
    """A kubeconfig with the token of a ServiceAccount that no RBAC rule names."""
    api.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kt-norights",
                                                                          "namespace": "default"}})
    tok = tmp_path / "token"
    tok.write_text(api.cp.create_token("kt-norights", "default", seconds=600))
    return api.cp.kubeconfig(tmp_path / "norights.kubeconfig", token_file=tok)


@pytest.mark.parametrize("args", READERS)
def test_a_token_without_rights_is_one_line_naming_verb_and_resource(api: Api, no_rights_token: Path,
                                                                     args: list[str]) -> None:
    line = one_line_error(cli(*args, "--kubeconfig", str(no_rights_token)), api.url)
    assert "403 Forbidden" in line, line
    user = 'User "system:serviceaccount:default:kt-norights"'
    assert f'{user} cannot list resource "nodes" in API group "" at the cluster scope' in line, line
    assert f'{user} cannot list resource "configmaps" in API group "" in the namespace "meshctl"' in line, line


@pytest.mark.parametrize("args", READERS)
def test_a_bad_token_is_one_line(api: Api, tmp_path: Path, args: list[str]) -> None:
    tok = tmp_path / "token"
    tok.write_text("kt-not-a-token")
    kc = api.cp.kubeconfig(tmp_path / "bad.kubeconfig", token_file=tok)
    line = one_line_error(cli(*args, "--kubeconfig", str(kc)), api.url)
    assert "refused the credentials (401 Unauthorized)" in line, line
    assert "kt-not-a-token" not in line  # the credential itself is never printed


@pytest.fixture(params=[None, "text/plain"], ids=["no-content-type", "text-plain"])
def not_kubernetes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, str | None]]:
    """An HTTPS server on 127.0.0.1 that answers every request `404` (Python's http.server, with a
    certificate of a CA the kubeconfig names): (its URL, the kubeconfig, its Content-Type)."""
    ctype: str | None = request.param
    ca = pki.make_ca(tmp_path / "kt-web", "kt-web-ca")
    cert = pki.make_cert(ca, tmp_path / "kt-web", "server", server=True, hosts=("127.0.0.1",))

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b"Not Found\n"
            self.send_response_only(404)
            if ctype:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert.cert, cert.key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    url = f"https://127.0.0.1:{httpd.server_address[1]}"
    tok = tmp_path / "token"
    tok.write_text("kt-token")
    try:
        yield url, write_kubeconfig(tmp_path / "web.kubeconfig", url, ca.cert, user="u", token_file=tok), ctype
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(5)


@pytest.mark.parametrize("args", READERS)
def test_a_server_that_is_not_kubernetes_is_one_line(not_kubernetes: tuple[str, Path, str | None],
                                                     args: list[str]) -> None:
    url, kc, ctype = not_kubernetes
    line = one_line_error(cli(*args, "--kubeconfig", str(kc)), url)
    said = ctype or "no Content-Type"
    assert f"answered 404 Not Found ({said}: 'Not Found'): this is not a Kubernetes API server" in line, line


def test_nodes_whose_agents_have_not_published_are_listed_as_pending(api: Api, kclient: Client) -> None:
    """A cluster where meshctl was just installed: Nodes without the agents' annotations, one without
    a pod CIDR either. `plan`, `graph` and `node list` name each pending node and what it lacks."""
    fill(kclient)
    create_node(kclient, node_obj("k3s-1", "10.42.5.0/24"))  # its agent has not started: no key
    create_node(kclient, node_obj("k3s-2", None))  # no pod CIDR allocated yet, no key

    def pending_lines(text: str) -> dict[str, str]:
        return {n: line for line in text.splitlines() for n in ("k3s-1", "k3s-2")
                if "pending" in line and re.search(rf"\b{n}\b", line)}

    def says_what_is_missing(lines: dict[str, str]) -> None:
        assert set(lines) == {"k3s-1", "k3s-2"}, lines
        assert re.search(r"public.key", lines["k3s-1"], re.I), lines["k3s-1"]
        assert re.search(r"pod.?cidr", lines["k3s-2"], re.I), lines["k3s-2"]

    r = cli("plan", "--kubeconfig", api.kubeconfig, "--node", "n1", "-o", "json")
    assert r.exit_code == 0, r.output
    says_what_is_missing(pending_lines(r.stderr))
    r = cli("graph", "--kubeconfig", api.kubeconfig)
    assert r.exit_code == 0, r.output
    says_what_is_missing(pending_lines(r.stderr + r.stdout))
    # the plan of a pending node: not "not a node", but that its agent has not published yet
    r = cli("plan", "--kubeconfig", api.kubeconfig, "--node", "k3s-1")
    assert "is not a node" not in r.stderr and "pending" in r.stderr and "k3s-1" in r.stderr, r.output
    r = cli("node", "list", "--kubeconfig", api.kubeconfig)
    assert r.exit_code == 0, r.output
    says_what_is_missing(pending_lines(r.stdout))

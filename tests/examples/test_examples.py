# SPDX-License-Identifier: Apache-2.0
"""Every topology file under examples/ runs: `meshctl plan` (every node, table and JSON), `graph`
(DOT that Graphviz reads, and `--render`) and `showconf` (every node and peer) exit 0 with the
output the example's header promises. A new example needs its row in EXPECTED, so none goes
untested."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from meshctl.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PATH_STATES = EXAMPLES / "path-state"
FILES = sorted(EXAMPLES.glob("*.yaml"))
PRIVATE_RUNGS = ("direct", "direct+ipip", "direct+vxlan")
# Parsed from the example's header: `# warning: TEXT` lines are the warnings it documents.
DOCUMENTED_WARNING = re.compile(r"^# warning: (.+)$", re.M)


@dataclass(frozen=True)
class Expect:
    """What an example's header promises: (node, other) -> the rung `plan --node node` gives."""
    paths: dict[tuple[str, str], str]
    peers: tuple[str, ...] = ()
    encap: dict[str, str] = field(default_factory=dict)  # pod CIDR -> encapsulation, in `node`'s plan


EXPECTED: dict[str, Expect] = {
    "hetzner-private-network.yaml": Expect(
        paths={("nbg1-1", "fsn1-1"): "direct+ipip", ("nbg1-1", "hel1-1"): "direct+ipip",
               ("fsn1-1", "hel1-1"): "direct+ipip", ("nbg1-1", "home1"): "tunnel", ("home1", "nbg1-1"): "tunnel"},
        encap={"10.42.1.0/24": "ipip", "10.42.2.0/24": "ipip"}),
    "digitalocean-vpc.yaml": Expect(
        paths={("fra1-1", "fra1-2"): "direct", ("ams3-1", "ams3-2"): "direct", ("fra1-1", "ams3-1"): "tunnel",
               ("fra1-2", "ams3-2"): "via-leader"}),
    "cross-mesh.yaml": Expect(
        paths={("rack-1", "rack-2"): "direct", ("cloud-1", "cloud-2"): "direct", ("rack-1", "cloud-1"): "tunnel",
               ("rack-2", "cloud-2"): "tunnel", ("cloud-2", "rack-1"): "tunnel"}),
    "dual-stack.yaml": Expect(
        paths={("dc-1", "dc-2"): "direct", ("vpc-1", "vpc-2"): "IPv4 wireguard-private, IPv6 direct",
               ("vpc-1", "v6-only"): "tunnel", ("v4-only", "v6-only"): "relay", ("v6-only", "v4-only"): "relay",
               ("dc-1", "v4-only"): "tunnel", ("dc-1", "v6-only"): "tunnel"}),
    "laptop-peer.yaml": Expect(
        paths={("fsn1-1", "fsn1-2"): "direct", ("fsn1-1", "do-1"): "tunnel", ("do-1", "fsn1-2"): "tunnel"},
        peers=("laptop",)),
}
# Path-state files: examples/path-state/<example>.<node>.yaml -> (other, the rung it then gives).
PATH_STATE_EXPECTED: dict[str, tuple[str, str]] = {
    "digitalocean-vpc.fra1-1.yaml": ("fra1-2", "direct+ipip"),
}


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def ok(r: Result) -> Result:
    assert r.exit_code == 0, (r.exit_code, r.stderr, r.exception)
    return r


def doc(f: Path) -> dict:
    d = yaml.safe_load(f.read_text())
    assert isinstance(d, dict)
    return d


def node_names(f: Path) -> list[str]:
    return [n["name"] for n in doc(f)["nodes"]]


def table_paths(table: str) -> dict[str, str]:
    """The PATHS section of `plan -o table`: node -> rung (a dual-stack pair whose families differ:
    `IPv4 wireguard-private, IPv6 direct`)."""
    section = table.split("\nPATHS\n", 1)[1].splitlines()[1:]
    return {name: path.strip() for name, path in (line.split(None, 1) for line in section if line.strip())}


def by_name(files: list[Path]) -> list:
    return [pytest.param(f, id=f.name) for f in files]


def test_every_example_is_expected_and_says_what_it_shows() -> None:
    assert FILES, "examples/ holds no topology file"
    assert sorted(EXPECTED) == [f.name for f in FILES]
    for f in FILES:
        header = f.read_text().split("\ncluster:", 1)[0]
        lines = header.splitlines()
        assert len(lines) >= 3 and all(ln.startswith("#") for ln in lines), f"{f.name}: no comment header"
        assert f"meshctl plan -f examples/{f.name}" in header, f"{f.name}: its header shows no command"


@pytest.mark.parametrize("f", by_name(FILES))
def test_plan_every_node_as_table_and_json(f: Path) -> None:
    exp = EXPECTED[f.name]
    seen: dict[tuple[str, str], str] = {}
    for node in node_names(f):
        table = ok(run("plan", "-f", str(f), "--node", node)).stdout
        paths = table_paths(table)
        assert paths[node] == "local"
        seen |= {(node, other): rung for other, rung in paths.items()}
        j = json.loads(ok(run("plan", "-f", str(f), "--node", node, "-o", "json")).stdout)
        assert j["node"] == node and j["granularity"] == doc(f)["mesh"]["granularity"]
        assert [e["action"] for e in j["fastpath"] if e["prefix"] == _pod_cidr(f, node)] == ["local"]
        if j["wireguard_ip"] is not None:  # a leader peers every `peers` entry
            assert set(exp.peers) <= {p["name"] for p in j["peers"] if p["kind"] == "peer"}
    assert {k: seen.get(k) for k in exp.paths} == exp.paths
    if exp.encap:
        first = next(a for a, _ in exp.paths)
        j = json.loads(ok(run("plan", "-f", str(f), "--node", first, "-o", "json")).stdout)
        assert {e["prefix"]: e.get("encap") for e in j["fastpath"] if e["prefix"] in exp.encap} == exp.encap


def _pod_cidr(f: Path, node: str) -> str:
    """The node's first pod CIDR (`pod_cidr`, or the first of `pod_cidrs`)."""
    n = next(n for n in doc(f)["nodes"] if n["name"] == node)
    return n["pod_cidr"] if "pod_cidr" in n else n["pod_cidrs"][0]


@pytest.mark.parametrize("f", by_name(FILES))
def test_only_documented_warnings(f: Path) -> None:
    documented = DOCUMENTED_WARNING.findall(f.read_text().split("\ncluster:", 1)[0])
    for args in (["plan", "--node", node_names(f)[0]], ["graph"], ["showconf", "node", node_names(f)[0]]):
        r = ok(run(*args, "-f", str(f)))
        warned = [ln.removeprefix(f"warning: {f.name}: ") for ln in r.stderr.splitlines()]
        assert warned == documented, (args, r.stderr)


@pytest.mark.parametrize("f", by_name(FILES))
def test_graph_is_dot_graphviz_reads_and_renders(f: Path, tmp_path: Path) -> None:
    dot = ok(run("graph", "-f", str(f))).stdout
    assert dot.startswith("digraph ")
    for n in node_names(f):
        assert f'"{n}" [label=' in dot
    if shutil.which("dot") is None:
        pytest.skip("Graphviz is not installed")
    p = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr, p.stderr
    assert "<svg" in p.stdout
    out = tmp_path / "mesh.svg"
    r = ok(run("graph", "-f", str(f), "--render", str(out)))
    assert r.stdout.strip() == f"wrote {out}"
    assert "<svg" in out.read_text()


@pytest.mark.parametrize("f", by_name(FILES))
def test_graph_draws_the_private_pairs_of_the_plan(f: Path) -> None:
    """A pair the plan keeps on the private network has an edge that is not WireGuard's (solid)."""
    dot = ok(run("graph", "-f", str(f))).stdout
    private = {frozenset(k) for k, rung in EXPECTED[f.name].paths.items() if rung in PRIVATE_RUNGS}
    drawn = {frozenset((a, b)) for a, b, style in re.findall(r'"([^"]+)" -> "([^"]+)" \[style=(\w+)', dot)
             if style != "solid"}
    assert private <= drawn, sorted(map(sorted, private - drawn))


@pytest.mark.parametrize("f", by_name(FILES))
def test_showconf_every_node_and_peer(f: Path) -> None:
    for node in node_names(f):
        conf = ok(run("showconf", "-f", str(f), "node", node)).stdout
        assert conf.startswith("[Interface]\n") and "ListenPort = " in conf
        j = json.loads(ok(run("plan", "-f", str(f), "--node", node, "-o", "json")).stdout)
        assert conf.count("[Peer]") == len(j["peers"])
        for p in j["peers"]:
            assert f"PublicKey = {p['public_key']}" in conf
    for peer in doc(f).get("peers", []):
        conf = ok(run("showconf", "-f", str(f), "peer", peer["name"])).stdout
        assert conf.startswith("[Interface]\n")
        assert f"# Address = {', '.join(peer['allowed_ips'])}" in conf
        assert conf.count("[Peer]") >= 1
        quick = ok(run("showconf", "-f", str(f), "peer", peer["name"], "-o", "wg-quick")).stdout
        assert f"\nAddress = {', '.join(peer['allowed_ips'])}\n" in quick
        as_peer = ok(run("showconf", "-f", str(f), "peer", peer["name"], "--as-peer")).stdout
        assert f"PublicKey = {peer['public_key']}" in as_peer
        if "preshared_key_file" in peer:  # the nodes' view names the key's file, never a key
            assert peer["preshared_key_file"] in as_peer


@pytest.mark.parametrize("state", by_name(sorted(PATH_STATES.glob("*.yaml"))))
def test_path_state_moves_the_pair_as_the_example_says(state: Path) -> None:
    assert state.name in PATH_STATE_EXPECTED
    example, node, _ = state.name.rsplit(".", 2)
    other, rung = PATH_STATE_EXPECTED[state.name]
    f = EXAMPLES / f"{example}.yaml"
    assert f"--path-state examples/path-state/{state.name}" in f.read_text()
    table = ok(run("plan", "-f", str(f), "--node", node, "--path-state", str(state))).stdout
    assert table_paths(table)[other] == rung
    assert table_paths(ok(run("plan", "-f", str(f), "--node", node)).stdout)[other] != rung


def _commands(text: str, prefix: str) -> list[list[str]]:
    """The `meshctl plan|graph|showconf -f examples/...` command lines of a text (continuations
    joined, comments and redirections dropped), as argument lists after `meshctl`."""
    joined = re.sub(r"\\\n#?\s*", " ", text)
    out = []
    for m in re.finditer(rf"^{re.escape(prefix)}(?:\.venv/bin/)?meshctl ((?:plan|graph|showconf) -f examples/[^#\n>]*)",
                         joined, re.M):
        out.append(m.group(1).split())
    return out


DOCUMENTED_COMMANDS = [pytest.param(f, "#   ", id=f.name) for f in FILES] + [
    pytest.param(ROOT / "README.md", "", id="README.md"),
    pytest.param(ROOT / "README.md", "  ", id="README.md-install"),
]


@pytest.mark.parametrize(("f", "prefix"), DOCUMENTED_COMMANDS)
def test_the_commands_the_headers_and_readme_show_run(f: Path, prefix: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cmds = _commands(f.read_text(), prefix)
    assert cmds, f"{f.name}: no meshctl command on an example"
    monkeypatch.chdir(ROOT)
    for argv in cmds:
        if "--render" in argv:
            argv[argv.index("--render") + 1] = str(tmp_path / "out.svg")
        r = run(*argv)
        assert r.exit_code == 0, (argv, r.stderr)
        assert r.stdout


def test_no_doc_names_a_topology_file_that_does_not_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "topo.yaml" not in readme
    for doc_ in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *FILES):
        for rel in re.findall(r"\bexamples/[\w./-]+\.yaml", doc_.read_text()):
            assert (ROOT / rel).is_file(), f"{doc_.name} names {rel}"

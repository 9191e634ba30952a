# SPDX-License-Identifier: Apache-2.0
"""`meshctl ui`: the live map in a browser (docs/ui.md). The imperative shell around ui/server.py
(HTTP and the page) and ui/view.py (what the panels say): it reads the topology and the agents'
summaries through the same Source as `plan` and `graph`, draws the graph model once per topology
(mesh.graph), colours it with what the agents see (at most once a FRESH_S, however many pages
ask), and answers a pair's `explain` with what `meshctl explain` computes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from meshctl import defaults
from meshctl.cli import targets
from meshctl.cli.plan import Source, _source_options
from meshctl.errors import InputError, MeshError
from meshctl.mesh.admit import admit_remotes, as_remote
from meshctl.mesh.graph import NODE_LEVEL_UP_TO, GraphModel, graph_model, with_seen
from meshctl.mesh.model import Topology
from meshctl.mesh.observed import NodeSeen, PeerSeen
from meshctl.mesh.segments import Remote
from meshctl.process import gc_paused
from meshctl.ui import view

if TYPE_CHECKING:  # the server (http.server) is imported when the command runs, not by every command
    from meshctl.ui.server import JSON, Prepared

FRESH_S = 1.0  # a read of the backend this recent answers the next request too
LIVE_BACKENDS = ("etcd", "kubernetes")  # where the agents publish what they see (Source.seen)


class Live:
    """The page's Provider over a Source: the topology and summaries read at most once a FRESH_S,
    the graph model drawn again only when the topology changed, and /api/graph serialised again
    only when what it shows changed. While the backend fails, the last map is served with the
    error beside it."""

    def __init__(self, src: Source, lab_name: str | None, remotes: Sequence[Topology] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.src, self.lab_name, self._clock = src, lab_name, clock
        self._remote_topos = tuple(as_remote(t) for t in remotes)
        self._remotes: list[Remote] = []
        self.live = src.backend in LIVE_BACKENDS
        self._lock = threading.Lock()
        self._warned: dict[str, None] = {}
        src.warn = self._warn
        self._topo: Topology | None = None
        self._model: GraphModel | None = None
        self._seen: dict[str, NodeSeen] = {}
        self._shown: tuple[dict[str, Mapping[str, PeerSeen]], int] | None = None
        self._prepared: Prepared | None = None
        self._version = 0
        self._read_at = float("-inf")
        self._ok_at = 0.0
        self._error: str | None = None

    def _warn(self, line: str) -> None:
        """Each warning once on stderr (the page polls: the same record would warn every time)."""
        if line not in self._warned:
            self._warned[line] = None
            click.echo(f"warning: {line}", err=True)

    def start(self) -> Topology:
        """The first read: its errors are the command's (one line, before the page is served)."""
        with self._lock:
            self._read()
        assert self._topo is not None
        return self._topo

    def _read(self) -> None:
        """Read the backend once, and draw again what changed. Raises what the backend raises."""
        self._read_at = self._clock()
        topo = self.src.load()
        seen = self.src.seen() if self.live else {}
        if topo != self._topo or self._model is None:
            remotes, rejected = admit_remotes(topo, self._remote_topos)
            for r in rejected:
                self._warn(f"rejected {r.name}: {r.reason}")
            with gc_paused():
                self._model = graph_model(topo, remotes)
            self._remotes = remotes
            self._topo, self._shown = topo, None
        self._seen, self._ok_at = seen, time.time()
        shown = ({n: s.peers for n, s in seen.items()}, len(self._warned))  # what the answer holds
        changed = shown != self._shown or self._error is not None
        self._shown, self._error = shown, None
        if changed:
            self._prepare()

    def _fresh(self) -> None:
        """Read again when the last read is older than FRESH_S; a failure is kept, not raised."""
        if self._clock() - self._read_at < FRESH_S:
            return
        try:
            self._read()
        except (MeshError, InputError) as e:
            if str(e) != self._error:
                self._error = str(e)
                self._prepare()

    def _prepare(self) -> None:
        from meshctl.ui.server import Prepared

        assert self._model is not None
        coloured = with_seen(self._model, self._seen) if self.live else self._model
        self._version += 1
        self._prepared = Prepared.of(view.graph_doc(coloured.to_json(), self._ok_at, self._error,
                                                    list(self._warned)), self._version)

    def _topology(self) -> Topology:
        with self._lock:
            self._fresh()
            assert self._topo is not None
            return self._topo

    # --- the Provider ---------------------------------------------------------------------------

    def meta(self) -> JSON:
        why = None if self.src.backend != "file" else \
            "explain reads the agents: a topology file has none (use --backend etcd|kubernetes or --lab)"
        return view.meta(self.src.name, self.src.backend, self.lab_name, self.live, why, NODE_LEVEL_UP_TO)

    def graph(self) -> Prepared:
        with self._lock:
            self._fresh()
            assert self._prepared is not None
            return self._prepared

    def node(self, name: str) -> JSON:
        topo = self._topology()
        with self._lock:
            seen, remotes = self._seen, self._remotes
        cluster, _, bare = name.rpartition("/")
        remote = next((r.topology for r in remotes if cluster and r.topology.cluster.name == cluster), None)
        if remote is not None:  # another cluster's node: its record and its own cluster's plan
            return view.node_detail(remote, bare, {}, False) | {"node": name}
        return view.node_detail(topo, name, seen, self.live)

    def search(self, query: str) -> JSON:
        topo = self._topology()
        hits = view.search(topo, query, [r.topology for r in self._remotes])
        return {"query": query, "hits": [h.to_json() for h in hits]}

    def explain(self, src: str, dst: str) -> JSON:
        """`meshctl explain SRC DST`: with --lab its agents along the path, else the agent on
        this host (cli.explain's builder, as the command runs it)."""
        from meshctl.agent.explain import format_explanation
        from meshctl.cli.explain import Agents, build, check_end

        if self.src.backend == "file":
            raise InputError("explain", f"{src} {dst}", "reads the agents: a topology file has none "
                             "(use --backend etcd|kubernetes or --lab)")
        pods = lab_nodes = None
        if self.lab_name is not None:
            loc = targets.lab("--lab")
            pods, lab_nodes = loc.pods(self.lab_name), loc.nodes(self.lab_name)
        src = check_end(src, "src", pods, lab_nodes)
        dst = check_end(dst, "dst", pods, lab_nodes)
        e, _ = build(Agents(defaults.METRICS_ADDR, self.lab_name), src, dst,
                     {k: v for k, v in (pods or {}).items() if k in (src, dst)})
        return {"src": src, "dst": dst, "explain": e.to_json(), "text": format_explanation(e, time.time())}


def _check_lab(lab_name: str) -> None:
    """A lab named with --lab must be up: one line, exit 2, before anything is served."""
    try:
        targets.lab("--lab").nodes(lab_name)
    except MeshError as e:
        if not targets.has_lab():
            raise
        why = str(e).removeprefix(f"lab {lab_name} ").removeprefix("is not up").strip()
        raise InputError("--lab", lab_name, f"is not up {why}: bring it up with meshctl lab up -f FILE") from None


@click.command("ui")
@click.option("--listen", default=defaults.UI_LISTEN, show_default=True, metavar="HOST:PORT",
              help="Where the page is served (loopback unless asked: the page has no login).")
@_source_options
@click.option("--remote", "remotes", multiple=True, type=click.Path(dir_okay=False),
              help="Another cluster's topology file (cluster mesh: each cluster a group of its own; read once); "
              "repeatable.")
def ui(listen: str, remotes: tuple[str, ...], **source: Any) -> None:
    """Serve the live map on a local web page: locations and clusters as groups, nodes inside,
    each pair coloured by the rung its nodes use now; click a node for its record, peers and
    paths, a pair for its `explain`; search a node or a pod address."""
    from meshctl.ui.server import bind, is_loopback, parse_listen

    parse_listen(listen)
    if source.get("lab_name") is not None and source.get("path"):
        raise InputError("--lab", source["lab_name"], "reads a lab's etcd: leave out -f")
    src = Source(**source)
    if source.get("lab_name") is not None:
        _check_lab(source["lab_name"])
    from meshctl.backends.file import load_topology

    live = Live(src, source.get("lab_name"), [*(load_topology(p) for p in remotes), *src.remote_topologies()])
    server = bind(listen, live)
    try:
        topo = live.start()
        host = parse_listen(listen)[0]
        if not is_loopback(host):
            click.echo(f"warning: --listen {listen}: the page has no login; anyone who reaches this address "
                       "sees the mesh", err=True)
        what = "live, from the agents' summaries" if live.live else "the plan only (a file has no summaries)"
        click.echo(f"meshctl ui: {server.url} ({len(topo.nodes)} nodes from {src.name}, {what}); Ctrl-C stops",
                   nl=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


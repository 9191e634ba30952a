# SPDX-License-Identifier: Apache-2.0
"""Which members lead each location: the documented order (segments.leader_order), except where
the published forwarding reports show a leader that does not forward (docs/mesh.md, "Leaders that
do not forward"). Pure: no I/O and no clock; time comes from the reports themselves.

Reports. Every member of a location with at least two members sends hairpin probes through each
other member (node/forward_prober.py: a packet that member must forward back to the sender, as it
forwards the location's traffic), and every leader probes, through its WireGuard tunnel, each other
location's leader it peers: an echo to that leader's own address (answered without forwarding) and
echoes to other members of its location (which that leader must forward in and their answers out).
Each node publishes one report (`ForwardingReport`): per judged node a verdict, `ok`, `bad` or
`recovering`, and since when (the publisher's clock), and the nodes whose own address answers it
(`reached`). `ForwardingJudge` turns answers and losses into verdicts with the same rules on every
node:

- `bad`: no answer for `down_after` seconds and at least `down_probes` probes lost in a row;
- `recovering`: answering again after `bad`; it becomes `ok` once it has answered for the mesh's
  `leader_hold` seconds with no `bad` condition in between (a flap starts the hold again);
- `ok`: answering (a member never seen `bad` is `ok` at its first answer).

A leader counts an echo through another location's leader as lost only while that leader's own
address answers it (`LeaderWitness`): a leader that answers but does not forward is `bad`; one that
does not answer at all (down, or the tunnel down) is not judged (its verdict leaves the report).

The decision (`choose_leaders`). Witnesses of a location's members are its other members
(*inside*) and, for the leaders they peer, the leaders of the other locations of the cluster
(*outside*: a location's leaders by its own members' reports, a first pass of the same rules). A
report counts when its publisher is such a witness, is fresh (its `at` within STALE_S of the
reports' median `at`: the facts' own clock, so every node that holds the same reports judges the
same, and one publisher's clock cannot age the others), and is not cut off: the judged node's own
address answers it (`reached`), or it sees another node `ok` (an inside witness: another member of
its location). A member is *out* when at least QUORUM counting reports call it `bad` or
`recovering`, they outnumber those that call it `ok`, and at least one of them is an inside
witness: one node alone never moves a location (its view may be its own NIC's, or a lie: its
credentials write only its own report), a tie keeps the member in, and outside witnesses alone
never do (an echo through a leader also fails when the member it was sent to is down, which only
that member's own live report tells apart). The location's leaders are the first
`mesh.leaders_per_location` members of the documented order that are not out; when every member
is out, the documented order stands (nothing says another would do better).

Each rule is a pure function of the reports, so the decision is the same on every node of the
cluster, and (the cluster mesh reads a remote cluster's reports with its records) on every node of
every cluster; witnesses are of the judged node's own cluster only. A node that cannot read the
reports keeps the answer its last view gave.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from meshctl.errors import InputError, MeshError
from meshctl.mesh.model import Node, Topology
from meshctl.mesh.segments import gateway, leader_order, segment_key, segments

Verdict = Literal["ok", "bad", "recovering"]
VERDICTS: tuple[str, ...] = ("ok", "bad", "recovering")
QUORUM = 2  # counting reports that must call a member out (and outnumber those calling it ok)
THROUGH_TARGETS = 3  # members of another location a leader echoes through its leader (the first by name)
# A publisher writes its report at least this often, changed or not (a changed verdict at once): at
# 5,000 nodes a write each 30 s is 170 a second, and a report only goes stale while its publisher's
# agent hangs with its lease kept alive (a dead agent's report goes with its lease).
HEARTBEAT_S = 30.0
STALE_S = 3 * HEARTBEAT_S  # a report this much older than the reports' median time counts no more
MAX_VERDICTS = 1024  # nodes one report may judge (its location's members, the other locations' leaders)
MAX_NAME = 253
JSON = dict[str, Any]


@dataclass(frozen=True)
class Judged:
    """One publisher's verdict on one member: `verdict` since `since` (the publisher's clock)."""

    verdict: Verdict
    since: float

    def to_json(self) -> JSON:
        return {"verdict": self.verdict, "since": self.since}


@dataclass(frozen=True)
class ForwardingReport:
    """What node `node` of `cluster` published at `at` (its clock): its verdict on each member of
    its location and each other location's leader that it probes, and the nodes whose own address
    answers it (`reached`, sorted)."""

    node: str
    cluster: str
    at: float
    verdicts: Mapping[str, Judged] = field(default_factory=dict)
    reached: tuple[str, ...] = ()

    def to_json(self) -> JSON:
        return {"node": self.node, "cluster": self.cluster, "at": self.at,
                "verdicts": {k: v.to_json() for k, v in sorted(self.verdicts.items())},
                "reached": list(self.reached)}

    def same_verdicts(self, other: ForwardingReport | None) -> bool:
        """The same verdicts and reach (a heartbeat that only moved `at` changes no decision)."""
        return (other is not None and other.node == self.node and dict(other.verdicts) == dict(self.verdicts)
                and other.reached == self.reached)

    @classmethod
    def from_json(cls, d: object, where: str) -> ForwardingReport:
        """A report as another node wrote it, parsed strictly: MeshError naming the field."""
        if not isinstance(d, dict):
            raise MeshError(f"{where}: a forwarding report must be an object, not {type(d).__name__}")
        node, cluster, at = d.get("node"), d.get("cluster"), d.get("at")
        if not isinstance(node, str) or not 0 < len(node) <= MAX_NAME:
            raise MeshError(f"{where}: node must be a node name, not {node!r}")
        if not isinstance(cluster, str) or len(cluster) > MAX_NAME:
            raise MeshError(f"{where}: cluster must be a cluster name, not {cluster!r}")
        at_s = _seconds(at, f"{where}: at")
        raw = d.get("verdicts") or {}
        if not isinstance(raw, dict):
            raise MeshError(f"{where}: verdicts must be an object, not {type(raw).__name__}")
        if len(raw) > MAX_VERDICTS:
            raise MeshError(f"{where}: verdicts holds {len(raw)}, at most {MAX_VERDICTS}")
        out: dict[str, Judged] = {}
        for name, v in raw.items():
            if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
                raise MeshError(f"{where}: verdicts: {name!r} is not a node name")
            if not isinstance(v, dict) or v.get("verdict") not in VERDICTS:
                raise MeshError(f"{where}: verdicts.{name}: verdict must be one of {', '.join(VERDICTS)}, "
                                f"not {v.get('verdict') if isinstance(v, dict) else v!r}")
            out[name] = Judged(v["verdict"], _seconds(v.get("since"), f"{where}: verdicts.{name}.since"))
        reached = d.get("reached") or []
        if not isinstance(reached, list) or len(reached) > MAX_VERDICTS:
            raise MeshError(f"{where}: reached must be a list of at most {MAX_VERDICTS} node names")
        for name in reached:
            if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
                raise MeshError(f"{where}: reached: {name!r} is not a node name")
        return cls(node, cluster, at_s, out, tuple(sorted(set(reached))))


def report_of(doc: object, where: str, node: str, cluster: str, owner: str) -> ForwardingReport:
    """The report `doc` found at `where` (an etcd key, a ConfigMap), which only `node`'s
    credentials may write: refused when it is not a report, names another node than `owner` says,
    or another cluster than the reader's."""
    r = ForwardingReport.from_json(doc, where)
    if r.node != node:
        raise InputError(f"{where}.node", r.node, f"does not match {owner}")
    if r.cluster != cluster:
        raise InputError(f"{where}.cluster", r.cluster, f"names another cluster than {owner}")
    return r


def _seconds(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise MeshError(f"{where} must be a time in seconds, not {v!r}")
    return float(v)


# --- the decision --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """One counting verdict on a member, as operators see it: who published it, the verdict, how
    long it has held and how old the report is (both in seconds, on the reports' clock)."""

    publisher: str
    member: str
    verdict: Verdict
    held_s: float
    age_s: float

    def to_json(self) -> JSON:
        return {"publisher": self.publisher, "member": self.member, "verdict": self.verdict,
                "held_s": self.held_s, "age_s": self.age_s}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Evidence:
        return cls(str(d["publisher"]), str(d["member"]), d["verdict"], float(d["held_s"]), float(d["age_s"]))

    def text(self) -> str:
        return f"{self.publisher}: {self.member} {self.verdict} for {self.held_s:.1f} s (report {self.age_s:.1f} s old)"


@dataclass(frozen=True)
class LocationLeaders:
    """One location's leaders: `leaders` (chosen), `static` (by the documented order alone), the
    members ruled `out` and the counting verdicts on them (`evidence`); `reason` says in one line
    why `leaders` differ from `static` ("" when they do not)."""

    key: str
    location: str
    leaders: tuple[str, ...]
    static: tuple[str, ...]
    out: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    reason: str = ""

    @property
    def moved(self) -> bool:
        return self.leaders != self.static

    def to_json(self) -> JSON:
        return {"key": self.key, "location": self.location, "leaders": list(self.leaders),
                "static": list(self.static), "out": list(self.out), "reason": self.reason,
                "evidence": [e.to_json() for e in self.evidence]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LocationLeaders:
        return cls(str(d["key"]), str(d.get("location", "")), tuple(d["leaders"]), tuple(d["static"]),
                   tuple(d.get("out", ())), tuple(Evidence.from_json(e) for e in d.get("evidence", ())),
                   str(d.get("reason", "")))


@dataclass(frozen=True)
class Leaders:
    """Every location's leaders (by segment key), and the reports' clock they were judged on."""

    locations: Mapping[str, LocationLeaders] = field(default_factory=dict)
    facts_at: float | None = None

    def chosen(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Topology.leaders: the locations whose leaders differ from the documented order's."""
        return tuple((k, loc.leaders) for k, loc in sorted(self.locations.items()) if loc.moved)

    def standby(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Topology.standby: per moved location, the documented order's leaders ruled out (a
        location whose members are all out keeps that order: it has not moved)."""
        ruled_out = ((k, tuple(n for n in loc.static if n in loc.out)) for k, loc in sorted(self.locations.items())
                     if loc.moved)
        return tuple((k, names) for k, names in ruled_out if names)


def facts_time(reports: Iterable[ForwardingReport]) -> float | None:
    """The reports' own clock: the median of their times (one publisher's clock cannot move it)."""
    ats = sorted(r.at for r in reports)
    return ats[len(ats) // 2] if ats else None  # the upper median


def choose_leaders(topo: Topology, reports: Mapping[str, ForwardingReport]) -> Leaders:
    """Every location's leaders from the admitted topology and the published reports, by node
    (see the module doc). Only location granularity has leaders to choose; in full and cross
    granularity, and for locations of one member, the result is the documented order.

    Two passes of the same rules: the first hears each location's own members only, and its
    leaders are the outside witnesses of the second (a pass's answer never feeds back into who
    witnesses it, so the decision needs no fixed point and is the same on every node)."""
    count = topo.mesh.leaders_per_location
    if topo.mesh.granularity != "location":
        return Leaders()
    groups: dict[str, list[Node]] = {}
    for n in topo.nodes:
        key = segment_key(n, "location")
        if key.startswith("location:"):
            groups.setdefault(key, []).append(n)
    counting = {name: r for name, r in reports.items() if r.node == name}
    now = facts_time(counting.values())
    inside = {key: _location(key, members, counting, now, count, {}) for key, members in sorted(groups.items())}
    leading = {name: key for key, loc in inside.items() for name in loc.leaders}
    out: dict[str, LocationLeaders] = {}
    for key, members in sorted(groups.items()):
        outside = {name: k for name, k in leading.items() if k != key}
        out[key] = _location(key, members, counting, now, count, outside) if outside else inside[key]
    return Leaders(out, now)


def _location(key: str, members: Sequence[Node], reports: Mapping[str, ForwardingReport], now: float | None,
              count: int, outside: Mapping[str, str]) -> LocationLeaders:
    """One location's leaders from the reports of its members and of the `outside` witnesses
    (name -> their location's key)."""
    order = leader_order(members)
    static = tuple(n.name for n in order[:count])
    location = members[0].location
    if len(members) < 2 or now is None:
        return LocationLeaders(key, location, static, static)
    names = {m.name for m in members}
    fresh = [r for name, r in sorted(reports.items())
             if (name in names or name in outside) and now - r.at <= STALE_S]
    ruled_out: list[str] = []
    evidence: list[Evidence] = []
    for m in order:
        against, for_, within = [], 0, False
        for r in fresh:
            v = r.verdicts.get(m.name)
            if v is None or r.node == m.name or not _not_cut_off(r, m.name, names if r.node in names else None):
                continue
            if v.verdict == "ok":
                for_ += 1
            else:
                within = within or r.node in names
                against.append(Evidence(r.node, m.name, v.verdict, round(max(0.0, r.at - v.since), 1),
                                        round(max(0.0, now - r.at), 1)))
        if within and len(against) >= QUORUM and len(against) > for_:
            ruled_out.append(m.name)
            evidence.extend(against)
    eligible = [m.name for m in order if m.name not in ruled_out]
    leaders = tuple(eligible[:count]) if eligible else static
    reason = ""
    if leaders != static:
        gone = [n for n in static if n not in leaders]
        reason = (f"{', '.join(gone)} {'does' if len(gone) == 1 else 'do'} not forward: "
                  + "; ".join(e.text() for e in evidence if e.member in gone))
    return LocationLeaders(key, location, leaders, static, tuple(ruled_out), tuple(evidence), reason)


def _not_cut_off(r: ForwardingReport, judged: str, members: set[str] | None) -> bool:
    """The publisher of `r` can tell "I am cut off" from "`judged` does not forward": `judged`'s
    own address answers it, or it sees another node `ok` (a member of its location, `members`,
    for an inside witness; any other node for an outside one)."""
    if judged in r.reached:
        return True
    return any(v.verdict == "ok" for n, v in r.verdicts.items()
               if n not in (judged, r.node) and (members is None or n in members))


@dataclass(frozen=True)
class LeaderTarget:
    """Another location's leader to probe through the tunnel: its own private address and the
    private addresses of members of its location to echo through it (IPv4, dotted)."""

    own: str
    through: tuple[str, ...]


def leader_targets(topo: Topology, name: str) -> dict[str, LeaderTarget]:
    """What node `name` probes through the tunnel while it leads its location (`topo`: planning
    with the chosen leaders): for each other location of its cluster whose traffic with its own it
    carries, the leader it peers there, with up to THROUGH_TARGETS other members (by name) to echo
    through that leader (IPv4 private addresses; a location with no other such member is not
    probed: nothing there shows whether its leader forwards)."""
    segs = segments(topo)
    mine = next((s for s in segs if any(m.name == name for m in s.members)), None)
    if mine is None or not mine.key.startswith("location:") or name not in {n.name for n in mine.all_leaders}:
        return {}
    keys = [s.key for s in segs]
    out: dict[str, LeaderTarget] = {}
    for s in segs:
        if s is mine or not s.key.startswith("location:") or gateway(mine, s, keys).name != name:
            continue
        far = gateway(s, mine, keys)
        own = far.internal(4)
        through = [str(a.ip) for m in s.members if m is not far and (a := m.internal(4)) is not None]
        if own is not None and through:
            out[far.name] = LeaderTarget(str(own.ip), tuple(through[:THROUGH_TARGETS]))
    return out


def with_leaders(topo: Topology, leaders: Leaders) -> Topology:
    """`topo` planning with `leaders` and their standby members (the same object when they change
    nothing)."""
    chosen, standby = leaders.chosen(), leaders.standby()
    if chosen == topo.leaders and standby == topo.standby:
        return topo
    return replace(topo, leaders=chosen, standby=standby)


# --- one publisher's verdicts ----------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeTuning:
    """The hairpin probes' pace and when a member is `bad`: 12 probes lost in a row over at least a
    second (10 a second) is what random loss does not do (20 % loss each way loses 36 % of round
    trips; twelve in a row: 5 in a million), and what a member that stopped forwarding does within
    1.2 s."""

    interval: float = 0.1
    timeout: float = 0.5
    down_after: float = 1.0
    down_probes: int = 12


@dataclass
class _Watch:
    verdict: Verdict | None = None
    since: float = 0.0
    last_answer: float | None = None
    lost: int = 0
    recovering_from: float | None = None
    frozen: bool = False  # no longer probed: its last word (bad, recovering) kept, unchanged


class ForwardingJudge:
    """One publisher's verdicts on the members it probes, from answers and losses at given times
    (pure: time is an argument, as mesh.chooser's)."""

    def __init__(self, hold: float, tuning: JudgeTuning | None = None) -> None:
        self.hold = hold
        self.tuning = tuning or JudgeTuning()
        self._watches: dict[str, _Watch] = {}
        self._answered_change = False  # an answer changed a verdict since the last tick

    def set_members(self, names: Iterable[str], now: float, keep: Iterable[str] = ()) -> None:
        """Probe these members (and no others): new ones start with no verdict. One no longer
        probed but named in `keep` keeps a `bad` or `recovering` verdict, frozen (a leader that
        stopped forwarding is no longer reachable through the tunnel once it no longer leads: its
        witness keeps saying so until it sees it again); probed again, a `recovering` one starts
        its hold over."""
        wanted, kept = set(names), set(keep)
        for n, w in list(self._watches.items()):
            if n in wanted:
                if w.frozen:
                    w.frozen, w.lost, w.last_answer = False, 0, None
                    if w.verdict == "recovering":
                        w.since = now
            elif n in kept and w.verdict in ("bad", "recovering"):
                w.frozen = True
            else:
                del self._watches[n]
        for n in wanted:
            self._watches.setdefault(n, _Watch(since=now))

    @property
    def members(self) -> list[str]:
        return sorted(self._watches)

    def answered(self, member: str, now: float) -> None:
        w = self._watches.get(member)
        if w is None or w.frozen:
            return
        w.last_answer, w.lost = now, 0
        if w.verdict is None:
            w.verdict, w.since = "ok", now
            self._answered_change = True
        elif w.verdict == "bad":
            w.verdict, w.since = "recovering", now
            self._answered_change = True

    def lost(self, member: str, now: float) -> None:
        w = self._watches.get(member)
        if w is not None and not w.frozen:
            w.lost += 1

    def tick(self, now: float) -> bool:
        """Apply the rules at `now`; True when a verdict changed since the last tick, by these rules
        or by an answer (a member's first `ok`, `recovering`): a report is due at once, so a
        location's members count as witnesses from their first answers, not a heartbeat later."""
        changed, self._answered_change = self._answered_change, False
        t = self.tuning
        for w in self._watches.values():
            if w.frozen:
                continue
            quiet_since = w.last_answer if w.last_answer is not None else w.since
            if w.lost >= t.down_probes and now - quiet_since >= t.down_after:
                if w.verdict != "bad":
                    w.verdict, w.since = "bad", now
                    changed = True
            elif w.verdict == "recovering" and now - w.since >= self.hold:
                w.verdict, w.since = "ok", now
                changed = True
        return changed

    def next_deadline(self) -> float | None:
        """When a hold runs out (a verdict changes without a new observation)."""
        at = [w.since + self.hold for w in self._watches.values() if w.verdict == "recovering" and not w.frozen]
        return min(at) if at else None

    def verdicts(self) -> dict[str, Judged]:
        return {n: Judged(w.verdict, round(w.since, 3)) for n, w in sorted(self._watches.items())
                if w.verdict is not None}


class LeaderWitness:
    """One node's verdicts as its report carries them (pure: time is an argument): hairpins
    through the members of its location (`hairpin`) and rounds of echoes about a node (`echo`):
    to the node's own address (answered without forwarding: whether it is reached), and, for
    another location's leader, through it to members of its location. An echo through a leader
    counts as lost only in a round in which that leader's own address answered: a leader that
    answers but does not forward turns `bad`; one not reached (down, or the tunnel down) is not
    judged, and its `ok` leaves the report (it no longer vouches for it).

    A leader no longer probed (it no longer leads: this node peers its successor) keeps a `bad` or
    `recovering` verdict, frozen, and stays `reached` as it was when last probed: its report still
    says what it saw, and still counts, from the moment the peer changes (a report that stopped
    counting then would bring the old leader straight back)."""

    def __init__(self, hold: float, tuning: JudgeTuning | None = None) -> None:
        self.forwards = ForwardingJudge(hold, tuning)
        self.reach = ForwardingJudge(0.0, tuning)  # `ok` at once when answering again: no hold
        self._leaders: frozenset[str] = frozenset()
        self._last_reached: frozenset[str] = frozenset()  # reached when last probed, not heard since

    @property
    def tuning(self) -> JudgeTuning:
        return self.forwards.tuning

    def set_hold(self, hold: float) -> None:
        self.forwards.hold = hold

    def set_targets(self, members: Iterable[str], leaders: Iterable[str], keep: Iterable[str], now: float) -> None:
        """Judge these members (hairpins, echoes to their own addresses) and other locations'
        leaders (echoes through the tunnel); a leader in `keep` no longer probed keeps a `bad`
        or `recovering` verdict (ForwardingJudge.set_members)."""
        members, leaders = list(members), list(leaders)
        before = self.reached()
        self._leaders = frozenset([*leaders, *keep])
        self.forwards.set_members([*members, *leaders], now, keep)
        self.reach.set_members([*members, *leaders], now)
        judged = self.forwards.verdicts()
        self._last_reached = frozenset(n for n in before if n in judged)

    def hairpin(self, member: str, answered: bool, now: float) -> None:
        (self.forwards.answered if answered else self.forwards.lost)(member, now)

    def echo(self, node: str, own: bool, through: bool | None, now: float) -> None:
        """One round of echoes about `node`: its own address answered (`own`) and, for a leader
        of another location, whether an echo through it answered (None: none was sent)."""
        (self.reach.answered if own else self.reach.lost)(node, now)
        if through:
            self.forwards.answered(node, now)
        elif through is not None and own:
            self.forwards.lost(node, now)

    def tick(self, now: float) -> bool:
        """ForwardingJudge.tick of both: True when the report changed."""
        changed = self.forwards.tick(now)
        return self.reach.tick(now) or changed

    def reached(self) -> tuple[str, ...]:
        """The nodes whose own address answers (or answered when last probed, and nothing since)."""
        heard = self.reach.verdicts()
        now_ok = {n for n, v in heard.items() if v.verdict == "ok"}
        return tuple(sorted(now_ok | {n for n in self._last_reached if n not in heard}))

    def verdicts(self) -> dict[str, Judged]:
        reached = set(self.reached())
        return {n: v for n, v in self.forwards.verdicts().items()
                if n not in self._leaders or v.verdict != "ok" or n in reached}

    def report(self, node: str, cluster: str, at: float) -> ForwardingReport:
        return ForwardingReport(node, cluster, at, self.verdicts(), self.reached())

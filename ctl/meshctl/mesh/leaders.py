# SPDX-License-Identifier: Apache-2.0
"""Which members lead each location: the documented order (segments.leader_order), except where
the published forwarding reports show a leader that does not forward (docs/mesh.md, "Leaders that
do not forward"). Pure: no I/O and no clock; time comes from the reports themselves.

Reports. Every member of a location with at least two members sends hairpin probes through each
other member (node/forward_prober.py: a packet that member must forward back to the sender, as it
forwards the location's traffic) and publishes one report (`ForwardingReport`): per probed member
a verdict, `ok`, `bad` or `recovering`, and since when (the publisher's clock). `ForwardingJudge`
turns answers and losses into verdicts with the same rules on every node:

- `bad`: no answer for `down_after` seconds and at least `down_probes` probes lost in a row;
- `recovering`: answering again after `bad`; it becomes `ok` once it has answered for the mesh's
  `leader_hold` seconds with no `bad` condition in between (a flap starts the hold again);
- `ok`: answering (a member never seen `bad` is `ok` at its first answer).

The decision (`choose_leaders`). A report counts when its publisher is an admitted member of the
same location as the member it judges (never of itself), when it is fresh (its `at` within
STALE_S of the reports' median `at`: the facts' own clock, so every node that holds the same
reports judges the same, and one publisher's clock cannot age the others), and when its publisher
sees at least one other member of the location `ok` (a node that reaches nobody is the one cut
off, and says nothing about the others). A member is *out* when at least QUORUM counting reports
call it `bad` or `recovering` and they outnumber those that call it `ok`: one node alone never
moves a location (its view may be its own NIC's, or a lie: its credentials write only its own
report), and a tie keeps the member in. The location's leaders are the first
`mesh.leaders_per_location` members of the documented order that are not out; when every member
is out, the documented order stands (nothing says another would do better).

Each rule is a pure function of the reports, so the decision is the same on every node of the
cluster, and (the cluster mesh reads a remote cluster's reports with its records) on every node of
every cluster. A node that cannot read the reports keeps the answer its last view gave.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from meshctl.errors import InputError, MeshError
from meshctl.mesh.model import Node, Topology
from meshctl.mesh.segments import leader_order, segment_key

Verdict = Literal["ok", "bad", "recovering"]
VERDICTS: tuple[str, ...] = ("ok", "bad", "recovering")
QUORUM = 2  # counting reports that must call a member out (and outnumber those calling it ok)
# A publisher writes its report at least this often, changed or not (a changed verdict at once): at
# 5,000 nodes a write each 30 s is 170 a second, and a report only goes stale while its publisher's
# agent hangs with its lease kept alive (a dead agent's report goes with its lease).
HEARTBEAT_S = 30.0
STALE_S = 3 * HEARTBEAT_S  # a report this much older than the reports' median time counts no more
MAX_VERDICTS = 256  # members one report may judge (a location's members)
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
    its location that it probes."""

    node: str
    cluster: str
    at: float
    verdicts: Mapping[str, Judged] = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {"node": self.node, "cluster": self.cluster, "at": self.at,
                "verdicts": {k: v.to_json() for k, v in sorted(self.verdicts.items())}}

    def same_verdicts(self, other: ForwardingReport | None) -> bool:
        """The same verdicts (a heartbeat that only moved `at` changes no decision)."""
        return other is not None and other.node == self.node and dict(other.verdicts) == dict(self.verdicts)

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
        return cls(node, cluster, at_s, out)


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


def facts_time(reports: Iterable[ForwardingReport]) -> float | None:
    """The reports' own clock: the median of their times (one publisher's clock cannot move it)."""
    ats = sorted(r.at for r in reports)
    return ats[len(ats) // 2] if ats else None  # the upper median


def choose_leaders(topo: Topology, reports: Mapping[str, ForwardingReport]) -> Leaders:
    """Every location's leaders from the admitted topology and the published reports, by node
    (see the module doc). Only location granularity has leaders to choose; in full and cross
    granularity, and for locations of one member, the result is the documented order."""
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
    out: dict[str, LocationLeaders] = {}
    for key, members in sorted(groups.items()):
        out[key] = _location(key, members, counting, now, count)
    return Leaders(out, now)


def _location(key: str, members: Sequence[Node], reports: Mapping[str, ForwardingReport], now: float | None,
              count: int) -> LocationLeaders:
    order = leader_order(members)
    static = tuple(n.name for n in order[:count])
    location = members[0].location
    if len(members) < 2 or now is None:
        return LocationLeaders(key, location, static, static)
    names = {m.name for m in members}
    fresh = [r for name, r in sorted(reports.items())
             if name in names and now - r.at <= STALE_S and _sees_others(r, names)]
    ruled_out: list[str] = []
    evidence: list[Evidence] = []
    for m in order:
        against, for_ = [], 0
        for r in fresh:
            v = r.verdicts.get(m.name)
            if v is None or r.node == m.name:
                continue
            if v.verdict == "ok":
                for_ += 1
            else:
                against.append(Evidence(r.node, m.name, v.verdict, round(max(0.0, r.at - v.since), 1),
                                        round(max(0.0, now - r.at), 1)))
        if len(against) >= QUORUM and len(against) > for_:
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


def _sees_others(r: ForwardingReport, names: set[str]) -> bool:
    """The publisher reaches some member of its location (an `ok` verdict): it is not cut off."""
    return any(v.verdict == "ok" for m, v in r.verdicts.items() if m in names and m != r.node)


def with_leaders(topo: Topology, leaders: Leaders) -> Topology:
    """`topo` planning with `leaders` (the same object when they change nothing)."""
    chosen = leaders.chosen()
    if chosen == topo.leaders:
        return topo
    return replace(topo, leaders=chosen)


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


class ForwardingJudge:
    """One publisher's verdicts on the members it probes, from answers and losses at given times
    (pure: time is an argument, as mesh.chooser's)."""

    def __init__(self, hold: float, tuning: JudgeTuning | None = None) -> None:
        self.hold = hold
        self.tuning = tuning or JudgeTuning()
        self._watches: dict[str, _Watch] = {}
        self._answered_change = False  # an answer changed a verdict since the last tick

    def set_members(self, names: Iterable[str], now: float) -> None:
        """Probe these members (and no others): new ones start with no verdict."""
        wanted = set(names)
        for n in [n for n in self._watches if n not in wanted]:
            del self._watches[n]
        for n in wanted:
            self._watches.setdefault(n, _Watch(since=now))

    @property
    def members(self) -> list[str]:
        return sorted(self._watches)

    def answered(self, member: str, now: float) -> None:
        w = self._watches.get(member)
        if w is None:
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
        if w is not None:
            w.lost += 1

    def tick(self, now: float) -> bool:
        """Apply the rules at `now`; True when a verdict changed since the last tick, by these rules
        or by an answer (a member's first `ok`, `recovering`): a report is due at once, so a
        location's members count as witnesses from their first answers, not a heartbeat later."""
        changed, self._answered_change = self._answered_change, False
        t = self.tuning
        for w in self._watches.values():
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
        at = [w.since + self.hold for w in self._watches.values() if w.verdict == "recovering"]
        return min(at) if at else None

    def verdicts(self) -> dict[str, Judged]:
        return {n: Judged(w.verdict, round(w.since, 3)) for n, w in sorted(self._watches.items())
                if w.verdict is not None}

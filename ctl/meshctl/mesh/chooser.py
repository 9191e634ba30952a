# SPDX-License-Identifier: Apache-2.0
"""The path chooser: probe observations in, one path-state per pair out. Pure (no I/O; time is an
argument), so its rules are tested with made-up clocks and the plan stays a pure function of
records and observations.

Probes come in three kinds, each testing what one family of rungs needs from the fabric:

    direct   a raw packet between the two nodes' pod addresses (a source/destination check drops it)
    udp      UDP between the nodes' private addresses, VXLAN-framed: direct+vxlan, wireguard-private
    ipip     IP-in-IP between the private addresses: direct+ipip

Rules (docs/mesh.md, "Probing and choice"):
- A kind is *down* once no reply has come for `down_after` seconds while at least `down_probes`
  probes went unanswered. A lost probe switches the kind to fast probing, so a dead rung is left
  in about `down_after` seconds, well within 3 s. Random loss does not make a kind down: it takes
  `down_probes` losses in a row at the fast rate (at 36 % round-trip loss, 0.36^30).
- A down kind is *up* again only after replies have kept coming for `hold` seconds with no down
  condition in between (the pair then moves back, make-before-break: the old rung still works).
- A kind that never delivered (a new pair, a peer whose agent is still starting) needs no hold:
  its first answer makes it up.
- A peer's probe arriving counts as an answer, and postpones this node's own next probe of that
  kind: of the two ends, mostly one probes each kind, which halves the cost.
- A pair's own choice is the cheapest rung of its ladder that is up and available on both nodes;
  replies carry the peer's own choice, and both ends use the costlier of the two (so an
  encapsulated or WireGuard rung is used in both directions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.mesh.model import RUNGS, Path, PathState, Rung, path_of

PROBE_KINDS: tuple[str, ...] = ("direct", "udp", "ipip")
KIND_RUNGS: dict[str, tuple[Rung, ...]] = {
    "direct": (Path.DIRECT,), "udp": (Path.DIRECT_VXLAN, Path.WIREGUARD_PRIVATE), "ipip": (Path.DIRECT_IPIP,)}
RUNG_KIND: dict[Path, str] = {r: k for k, rungs in KIND_RUNGS.items() for r in rungs}
PEER_CHOICE_TTL_S = 5.0  # a peer's reported choice counts this long after its last reply


@dataclass(frozen=True)
class ProbeTuning:
    interval: float = 1.0        # steady probing of the kind carrying the pair's rung
    standby_interval: float = 5.0  # the other kinds (they only say where to go next)
    fast_interval: float = 0.05  # after a lost probe, until a reply comes or the kind is down
    timeout: float = 0.5         # a probe unanswered this long is lost (a busy agent answers late)
    down_after: float = 1.5      # no reply for this long ...
    down_probes: int = 8         # ... and this many lost probes: down
    hold: float = 10.0           # a down kind answers this long before its rungs are used again


@dataclass
class KindHealth:
    """What the probes of one kind to one peer showed."""

    up: bool | None = None          # None: no verdict yet
    since: float = 0.0              # start of the current silence (last reply, or first probe)
    lost: int = 0                   # probes lost since the last reply
    candidate: float | None = None  # down, answering again since
    ever_up: bool = False           # has delivered at some time (only then does a return wait for the hold)
    held: bool = False              # came back after the hold time (the reason of the next move onto it)
    rtt: float | None = None        # smoothed round-trip time, seconds

    @property
    def fast(self) -> bool:
        return self.lost > 0 and self.up is not False


@dataclass(frozen=True)
class Change:
    """The rung a pair uses changed (metrics and logs name the reason)."""

    peer: str
    old: Rung | None
    new: Rung
    reason: str
    at: float


@dataclass
class PairState:
    ladder: tuple[Rung, ...]
    kinds: dict[str, KindHealth] = field(default_factory=dict)
    peer_rungs: frozenset[Rung] | None = None  # what the peer says it can take; None: unknown yet
    peer_choice: Rung | None = None
    peer_seen: float = -1e9
    rung: Rung | None = None                   # the rung last reported


class Chooser:
    """Per-pair health from probe observations, and the path-state the plan reads."""

    def __init__(self, local_rungs: Iterable[Rung], tuning: ProbeTuning | None = None) -> None:
        self.tuning = tuning or ProbeTuning()
        self.local_rungs = frozenset(local_rungs)
        self.pairs: dict[str, PairState] = {}
        self.changes: list[Change] = []  # every change since start (the caller may trim it)
        self._recovering: set[tuple[str, str]] = set()  # (peer, kind) holding before up again

    # --- which peers --------------------------------------------------------------------------

    def set_peers(self, ladders: dict[str, Sequence[Rung]], now: float) -> None:
        """The peers to probe and each pair's ladder (ladder.pair_rungs). Peers no longer listed are
        forgotten; a ladder that changed keeps what the probes already showed."""
        for name in [n for n in self.pairs if n not in ladders]:
            del self.pairs[name]
        for name, ladder in ladders.items():
            p = self.pairs.get(name)
            if p is None:
                p = self.pairs[name] = PairState(tuple(ladder))
            p.ladder = tuple(ladder)
            for k in self.kinds_for(p):
                p.kinds.setdefault(k, KindHealth(since=now))

    def kinds_for(self, p: PairState) -> list[str]:
        """The probe kinds a pair needs: those of its private rungs this node can use."""
        return [k for k in PROBE_KINDS if any(r in self.local_rungs for r in KIND_RUNGS[k] if r in p.ladder)]

    # --- observations -------------------------------------------------------------------------

    def lost(self, peer: str, kind: str, now: float) -> None:
        h = self._health(peer, kind)
        if h is not None:
            h.lost += 1

    def reply(self, peer: str, kind: str, rtt: float | None, now: float, peer_rungs: frozenset[Rung] | None = None,
              peer_choice: Rung | None = None) -> None:
        """An answer to our probe (`rtt` set), or the peer's own probe of this kind arriving
        (`rtt` None: it proves the peer's direction; should ours fail, the peer's answers stop,
        the peer leaves the rung and its probes carry that choice here)."""
        p = self.pairs.get(peer)
        h = self._health(peer, kind)
        if p is None or h is None:
            return
        h.lost = 0
        h.since = now
        if rtt is not None:
            h.rtt = rtt if h.rtt is None else 0.8 * h.rtt + 0.2 * rtt
        if h.up is None or (h.up is False and not h.ever_up):
            h.up = True  # a kind that never delivered before (a peer still starting) needs no hold
            h.ever_up = True
        elif not h.up and h.candidate is None:
            h.candidate = now
            self._recovering.add((peer, kind))
        if peer_rungs is not None:
            p.peer_rungs = peer_rungs
        if peer_choice is not None:
            p.peer_choice = peer_choice
            p.peer_seen = now

    def _health(self, peer: str, kind: str) -> KindHealth | None:
        p = self.pairs.get(peer)
        return p.kinds.get(kind) if p is not None else None

    # --- verdicts -----------------------------------------------------------------------------

    def tick(self, now: float, peers: Iterable[str] | None = None) -> bool:
        """Apply the rules at time `now` to `peers` (None: all); True when some pair's rung
        changed (the plan must be redone)."""
        t = self.tuning
        changed = False
        names = list(self.pairs) if peers is None else [n for n in peers if n in self.pairs]
        for name in names:
            p = self.pairs[name]
            for h in p.kinds.values():
                silent = now - h.since >= t.down_after and h.lost >= t.down_probes
                if silent:
                    h.candidate, h.held = None, False
                    if h.up is not False:
                        h.up = False
                elif h.up is False and h.candidate is not None and now - h.candidate >= t.hold:
                    h.up, h.candidate, h.held = True, None, True
            new = self.agreed(name, now)
            if new is not None and new != p.rung:
                self.changes.append(Change(name, p.rung, new, self._reason(p, new, now), now))
                p.rung = new
                changed = True
                # Only the kind the pair moved onto has spent its hold as a reason: another kind's
                # completed hold stays the reason of a later move to its rung (both ends' holds
                # end apart, so the pair may stop on a costlier rung on its way back).
                moved_onto = p.kinds.get(RUNG_KIND.get(new, ""))
                if moved_onto is not None:
                    moved_onto.held = False
        return changed

    def _reason(self, p: PairState, new: Rung, now: float) -> str:
        if p.rung is None:
            return "first probes"
        own = self.own_choice(p)
        if own is not None and RUNGS.index(new) > RUNGS.index(own):
            return "peer chose " + new
        if RUNGS.index(new) > RUNGS.index(p.rung):
            return f"{p.rung} stopped delivering"
        h = p.kinds.get(RUNG_KIND.get(new, ""))
        if h is not None and h.held:
            return f"{new} delivered for the hold time"
        return f"{new} became available"

    def usable(self, p: PairState, rung: Rung) -> bool:
        """The rung delivers and both ends carry it. Another rung than the pair's own must also be
        fresh (its last probe answered): a stand-by kind last heard seconds ago may have died
        with the rung being left (a blackhole takes every kind at once)."""
        if rung == Path.TUNNEL:
            return True
        if rung not in self.local_rungs or (p.peer_rungs is not None and rung not in p.peer_rungs):
            return False
        h = p.kinds.get(RUNG_KIND[rung])
        if h is None or h.up is not True:
            return False
        return rung == p.rung or h.lost == 0

    def verdicts_ready(self, p: PairState) -> bool:
        return all(h.up is not None for h in p.kinds.values())

    def own_choice(self, p: PairState) -> Rung | None:
        """This node's choice for the pair alone (None until every probe kind has a verdict)."""
        if not self.verdicts_ready(p):
            return None
        for r in p.ladder:
            if self.usable(p, r):
                return r
        return p.ladder[0]  # a ladder without tunnel (location members): nothing better

    def agreed(self, peer: str, now: float) -> Rung | None:
        p = self.pairs[peer]
        own = self.own_choice(p)
        if own is None:
            return None
        theirs = p.peer_choice if now - p.peer_seen <= PEER_CHOICE_TTL_S else None
        if theirs is not None and theirs in p.ladder and p.ladder.index(theirs) > p.ladder.index(own):
            return theirs
        return own

    def path_state(self) -> PathState:
        """Peer -> the private rungs the plan may take, i.e. those that deliver, are available on
        both ends and are no cheaper than the agreed rung. Peers without a verdict are absent (the
        plan then assumes every rung works)."""
        out: PathState = {}
        for name, p in self.pairs.items():
            if p.rung is None:
                continue
            at = p.ladder.index(p.rung)
            out[name] = frozenset(r for r in p.ladder[at:] if r != Path.TUNNEL and self.usable(p, r))
        return out

    def next_deadline(self) -> float | None:
        """The earliest time a rule may fire without a new observation (a hold running out).
        Cheap: only kinds that are recovering are looked at (the prober asks on every wake-up)."""
        at = None
        for key in list(self._recovering):
            p = self.pairs.get(key[0])
            h = p.kinds.get(key[1]) if p is not None else None
            if h is None or h.candidate is None:
                self._recovering.discard(key)
            elif at is None or h.candidate + self.tuning.hold < at:
                at = h.candidate + self.tuning.hold
        return at

    def due(self, peer: str, kind: str) -> float:
        """Seconds until the next probe of one kind to one peer: fast after a loss (of any kind of
        the pair); steady for the
        kind carrying the pair's rung and for kinds of cheaper rungs (so a recovery is seen
        promptly), and before the first verdict; slow for kinds only costlier rungs need."""
        p = self.pairs[peer]
        h = p.kinds[kind]
        if h.fast or any(k.fast for k in p.kinds.values()):
            # A kind losing probes makes the whole pair probe fast: should its rung be left, the
            # others' verdicts are fresh.
            return self.tuning.fast_interval
        if h.up is None or p.rung is None:
            return self.tuning.interval
        at = RUNGS.index(p.rung)
        if any(RUNGS.index(r) <= at for r in KIND_RUNGS[kind]):
            return self.tuning.interval
        return self.tuning.standby_interval

    def status(self) -> dict[str, PairProbe]:
        """Per peer: rung, the kinds' verdicts and RTTs (for /status and metrics)."""
        return {name: PairProbe(p.rung, tuple(p.ladder), p.peer_choice,
                                {k: ProbeVerdict(h.up, h.lost, round(h.rtt * 1000, 3) if h.rtt is not None else None,
                                                 h.candidate) for k, h in p.kinds.items()})
                for name, p in sorted(self.pairs.items())}


# --- the prober's status, as /status serves it (a published interface: agent/status.py) ---------

JSON = dict[str, Any]


@dataclass(frozen=True)
class ProbeVerdict:
    """One probe kind towards one peer: up (None: no verdict yet), probes lost since the last
    reply, smoothed RTT, and since when a down kind answers again. The tally (probes of this
    node sent and answered since the peer was first probed, the last answer's RTT and age) is
    None, and its keys absent, from a prober that does not count."""

    up: bool | None
    lost: int
    rtt_ms: float | None
    recovering_since: float | None
    sent: int | None = None
    answered: int | None = None
    last_rtt_ms: float | None = None
    last_reply_age_s: float | None = None

    def to_json(self) -> JSON:
        out: JSON = {"up": self.up, "lost": self.lost, "rtt_ms": self.rtt_ms, "recovering_since": self.recovering_since}
        for key in _TALLY_KEYS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> ProbeVerdict:
        return cls(d.get("up"), d.get("lost", 0), d.get("rtt_ms"), d.get("recovering_since"),
                   *(d.get(k) for k in _TALLY_KEYS))


_TALLY_KEYS = ("sent", "answered", "last_rtt_ms", "last_reply_age_s")


@dataclass(frozen=True)
class RungMove:
    """A pair's rung changed: from (None: the first choice), to, why, and when (wall clock)."""

    old: Path | None
    new: Path
    reason: str
    at: float

    def to_json(self) -> JSON:
        return {"from": self.old, "to": self.new, "reason": self.reason, "at": self.at}

    @classmethod
    def from_json(cls, d: JSON) -> RungMove:
        return cls(opt_path(d.get("from"), "history.from"), path_of(d.get("to"), "history.to"),
                   str(d.get("reason", "")), d.get("at", 0.0))


@dataclass(frozen=True)
class PairProbe:
    """A probed pair: the rung it takes, its ladder, the peer's own choice, each kind's verdict,
    and its last moves, oldest first (`history`: absent before the pair's first choice)."""

    rung: Path | None
    ladder: tuple[Path, ...]
    peer_choice: Path | None
    probes: dict[str, ProbeVerdict]
    history: tuple[RungMove, ...] = ()

    def to_json(self) -> JSON:
        out: JSON = {"rung": self.rung, "ladder": list(self.ladder), "peer_choice": self.peer_choice,
                     "probes": {k: v.to_json() for k, v in self.probes.items()}}
        if self.history:
            out["history"] = [m.to_json() for m in self.history]
        return out

    @classmethod
    def from_json(cls, d: JSON) -> PairProbe:
        return cls(opt_path(d.get("rung"), "rung"), tuple(path_of(r, "ladder") for r in d.get("ladder") or ()),
                   opt_path(d.get("peer_choice"), "peer_choice"),
                   {k: ProbeVerdict.from_json(v) for k, v in (d.get("probes") or {}).items()},
                   tuple(RungMove.from_json(m) for m in d.get("history") or ()))


@dataclass(frozen=True)
class ProbeStatus:
    """The path prober (intra_subnet auto): its port, the rungs this node carries, probes sent and
    received, its CPU time, and every probed pair."""

    port: int
    local_rungs: tuple[Path, ...]
    sent: int
    received: int
    cpu_s: float
    pairs: dict[str, PairProbe]

    def to_json(self) -> JSON:
        return {"port": self.port, "local_rungs": list(self.local_rungs), "sent": self.sent,
                "received": self.received, "cpu_s": self.cpu_s,
                "pairs": {n: p.to_json() for n, p in self.pairs.items()}}

    @classmethod
    def from_json(cls, d: JSON) -> ProbeStatus:
        return cls(d.get("port", 0), tuple(path_of(r, "local_rungs") for r in d.get("local_rungs") or ()),
                   d.get("sent", 0), d.get("received", 0),
                   d.get("cpu_s", 0.0), {n: PairProbe.from_json(p) for n, p in (d.get("pairs") or {}).items()})


def opt_path(text: object, where: str) -> Path | None:
    """`path_of` of a value that may be absent (None)."""
    return None if text is None else path_of(text, where)

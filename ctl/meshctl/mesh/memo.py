# SPDX-License-Identifier: Apache-2.0
"""The identity rule, written once: every value the pure core reads or hands out (a parsed Node or
Peer, an admitted Topology, a Remote, a NodePlan and its parts) is immutable, and whoever made it
hands out the same object again for as long as its inputs are unchanged (the backends' parse cache
for an unchanged record, admission for an unchanged cluster: mesh.admit_memo, the planner and the
agent's memos for unchanged inputs). So "the same object" means "unchanged", and a memo may test
its inputs with `is` (`same`, `same_items`) where `==` would compare every field of every node.
The converse does not hold: a new object may be equal to the old one, which costs a recomputation,
never a wrong answer.

A memo is an object its owner keeps (the agent keeps one `plan.PlanCache` and its `memos.PureMemos`);
nothing here, nor anywhere in mesh/, is module-level state.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def same(a: object, b: object) -> bool:
    """`a` is `b`: unchanged by the identity rule."""
    return a is b


def same_items(a: Sequence[object], b: Sequence[object]) -> bool:
    """The same objects in the same order: unchanged by the identity rule."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class SameObject:
    """A cache key of an object by identity (the identity rule) and a part by value: equal when
    the object is the same one and the parts are equal."""

    __slots__ = ("obj", "part", "_hash")

    def __init__(self, obj: object, part: Hashable) -> None:
        self.obj = obj
        self.part = part
        self._hash = hash((id(obj), part))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SameObject) and other.obj is self.obj and other.part == self.part


class UsedMemo(Generic[K, V]):
    """A memo that keeps what the last use (a plan) needed, and nothing else: what a use after a
    change did not touch is reused, and what was built for records that have gone since is dropped
    when the next use is done (`done`), so its owner holds one use's worth, not a cache's worth of
    stale values."""

    def __init__(self) -> None:
        self._last: dict[K, V] = {}
        self._now: dict[K, V] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: K, make: Callable[[], V]) -> V:
        v = self._now.get(key)
        if v is None:
            v = self._last.get(key)
            if v is None:
                self.misses += 1
                v = make()
            else:
                self.hits += 1
            self._now[key] = v
        else:
            self.hits += 1
        return v

    def keep(self, keys: Iterable[K]) -> None:
        """Count `keys` as used by this use (a reused value keeps the parts it was built from for
        the value that replaces it after a change)."""
        for k in keys:
            if k not in self._now and k in self._last:
                self._now[k] = self._last[k]

    def done(self) -> None:
        """Forget what the use just done did not need."""
        self._last, self._now = self._now, {}

    def clear(self) -> None:
        self._last, self._now = {}, {}

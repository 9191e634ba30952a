"""Errors that reach a person: one line naming the field and the value."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input. `path` is the field path (`nodes[3].pod_cidr`), `value` what was found there.

    str() gives the one line the CLI prints and the agent logs, e.g.
    `nodes[3].pod_cidr: '10.42.1.0/33' is not a CIDR`.
    """

    def __init__(self, path: str, value: object, reason: str):
        self.path = path
        self.value = value
        self.reason = reason
        super().__init__(f"{path}: {value!r} {reason}" if path else f"{value!r} {reason}")

    def prefixed(self, prefix: str) -> InputError:
        """The same error, its line led by `prefix` (a file name: `topo.yaml: nodes[3]...`)."""
        err = InputError(self.path, self.value, self.reason)
        err.args = (f"{prefix}{self}",)
        return err

    @classmethod
    def from_line(cls, line: str) -> InputError:
        """An error whose line is already written (`nodes[2].pod_cidr: '...' overlaps ...`)."""
        path, _, rest = line.partition(": ")
        err = cls(path, None, rest)
        err.args = (line,)
        return err


class MeshError(RuntimeError):
    """A failure of the environment (a missing tool, an unreachable store) with a clear message."""

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

    def within(self, prefix: str) -> InputError:
        """The same error with its path placed under `prefix` (a record key, a file name)."""
        path = f"{prefix}.{self.path}" if self.path and not self.path.startswith("[") else prefix + self.path
        return InputError(path, self.value, self.reason)


class MeshError(RuntimeError):
    """A failure of the environment (a missing tool, an unreachable store) with a clear message."""

# SPDX-License-Identifier: Apache-2.0
"""Errors that reach a person: one line naming the field and the value."""

from __future__ import annotations


class _Missing:
    """The value of a field that is not there at all (`InputError(path, MISSING, "is required")`),
    or one the line leaves out (an unknown key's value, which may be a whole node list)."""

    def __repr__(self) -> str:
        return "missing"


MISSING = _Missing()


def show(value: object) -> str:
    """A value as the person wrote it in YAML or JSON: `null`, `true`, `'text'`, `42`; one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def one_line(text: str) -> str:
    """`text` with control characters escaped (a field name from a file may hold a newline)."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


class InputError(ValueError):
    """Bad input. `path` is the field path (`nodes[3].pod_cidr`), `value` what was found there.

    str() gives the one line the CLI prints and the agent logs, e.g.
    `nodes[3].pod_cidr: '10.42.1.0/33' is not a CIDR`; a field that is not there reads
    `nodes[3].name: is required` (value MISSING), an empty one `nodes[3].pod_cidr: null is not a CIDR`.
    """

    def __init__(self, path: str, value: object, reason: str):
        self.path = path
        self.value = value
        self.reason = reason
        what = reason if value is MISSING else f"{show(value)} {reason}"
        super().__init__(f"{one_line(path)}: {what}" if path else what)

    def prefixed(self, prefix: str) -> InputError:
        """The same error, its line led by `prefix` (a file name: `topo.yaml: nodes[3]...`)."""
        err = InputError(self.path, self.value, self.reason)
        err.args = (f"{one_line(prefix)}{self}",)
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

# SPDX-License-Identifier: Apache-2.0
"""`python -m meshctl.datapath.compile PIN_DIR`: compile the programs with bcc and pin them (and
their maps) under PIN_DIR, then exit. The loader runs this as a child so the agent never holds
bcc/LLVM in memory; errors are one line on stderr and exit status 1."""

from __future__ import annotations

import sys

from meshctl.datapath.loader import compile_and_pin_here
from meshctl.errors import MeshError


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m meshctl.datapath.compile PIN_DIR", file=sys.stderr)
        return 2
    try:
        compile_and_pin_here(argv[0])
    except (MeshError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

# SPDX-License-Identifier: Apache-2.0
"""`python -m meshctl.cli`."""

from meshctl.cli import main

main()

"""`python -m meshctl.cli`."""

from meshctl.cli import main

main()

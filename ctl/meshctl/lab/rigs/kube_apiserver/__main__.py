# SPDX-License-Identifier: Apache-2.0
"""`python -m meshctl.lab.rigs.kube_apiserver`."""

from meshctl.lab.rigs.kube_apiserver.cli import main

main()

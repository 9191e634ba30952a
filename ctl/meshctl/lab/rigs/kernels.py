# SPDX-License-Identifier: Apache-2.0
"""The Debian kernel series a lab may boot (lab/vms: `nodes[].kernel`, `lab up --kernel`, the test
matrix). Its own module, with no imports, so `meshctl lab up --help` lists them cheaply."""

KERNEL_SERIES = ("5.10", "6.1", "6.12")

# SPDX-License-Identifier: Apache-2.0
"""The namespace lab and the rigs the tests and benchmarks use. Nothing that ships imports this
package; the `meshctl lab` commands reach the CLI as a plugin (entry point group `meshctl.cli`)."""

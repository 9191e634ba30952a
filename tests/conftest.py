# SPDX-License-Identifier: Apache-2.0
"""Shared test helpers. Tests that need root and namespaces create their own, with prefixes unique
to the test run, and remove them on success and failure."""

# SPDX-License-Identifier: Apache-2.0
"""The pure core: the model, field parsers, record codecs, admission, the plan and its renderings.
Nothing here does I/O or reads a clock: every function is a function of its arguments."""

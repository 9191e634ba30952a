# SPDX-License-Identifier: Apache-2.0
"""`meshctl ui`'s page: its server (server.py), what its panels say (view.py) and its assets
(assets/: HTML, hand-written JavaScript drawing SVG, CSS; shipped in the package, no CDN)."""

# SPDX-License-Identifier: Apache-2.0
"""Defaults one node's agent and the commands that talk to it share, each defined once here: the
agent's flags, `meshctl cleanup`, `status` and the Kubernetes backend all read them from this
module, so a changed default cannot leave one side behind."""

from __future__ import annotations

from pathlib import Path

WG_INTERFACE = "kilo0"  # Kilo's name: a node migrating from Kilo keeps its interface
STATE_DIR = Path("/var/lib/meshctl")  # keys (0600), the lease, saved remote views
WG_RUN_DIR = Path("/run/meshctl/wireguard")  # wireguard-go's private UAPI socket directory
PIN_ROOT = "/sys/fs/bpf/meshctl"  # one folder per node under it: programs, maps, links
# Where each node's datapath outcome (`objects: ...`) is recorded for `datapath status` (bpffs holds
# no plain files, and a node on kernel routes has nothing pinned to read it from).
DATAPATH_RUN_DIR = Path("/run/meshctl/datapath")
METRICS_ADDR = "127.0.0.1:9736"  # /metrics, /healthz, /status; loopback unless asked
ANSWER_WAIT_S = 3.0  # how long a command waits for an agent's /status answer
ANSWER_WAIT_ENV = "MESHCTL_AGENT_WAIT"  # ... unless this says otherwise (agent.server.answer_wait)
UI_LISTEN = "127.0.0.1:8470"  # `meshctl ui`'s page; loopback unless asked (it has no login)
# Seconds peers keep a node whose record's lease ran out (its agent restarting), in its own cluster and
# in every cluster that meshes with it (`meshctl agent --lapse-grace`, `meshctl clustermesh cache`).
LAPSE_GRACE_S = 60.0
# The clusterset.local DNS server of the cluster-mesh cache (`clustermesh cache --mcs`): an
# unprivileged port, the Service meshctl-clusterset-dns maps port 53 to it.
CLUSTERSET_DNS_ADDR = "0.0.0.0:1053"
PROBE_PORT = 51871  # UDP port of the path probes; the fast path names a probe by it in monitor events
REGION_LABEL = "topology.kubernetes.io/region"  # the Node label that names a location
# Global services and the MCS controller: a pass at least this often, woken or not (the slow safety
# net of informers), and how often the elected writer reads back what it published in etcd.
SERVICES_RESYNC_S = 30.0
SERVICES_FULL_SYNC_S = 30.0

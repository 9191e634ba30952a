# SPDX-License-Identifier: Apache-2.0
"""etcd for meshctl: a small v3 client over the JSON gateway (`client`), a server process for the
lab and tests (`process`), and a throwaway PKI for mTLS (`pki`)."""

from meshctl.etcd.client import (
    Compacted,
    EtcdClient,
    EtcdError,
    Event,
    KeyValue,
    PermissionDenied,
    WatchIdle,
    prefix_end,
)

__all__ = ["Compacted", "EtcdClient", "EtcdError", "Event", "KeyValue", "PermissionDenied", "WatchIdle", "prefix_end"]

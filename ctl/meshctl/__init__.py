"""meshctl: a multi-cloud, multi-cluster network mesh for Kubernetes."""

__version__ = "0.1.0"

# Routes the agent installs carry this protocol number so it removes only its own.
RT_PROTO = 0x6D  # 109, unassigned in /etc/iproute2/rt_protos
# Routes through the tunnel devices of the kernel fallback of encapsulated paths (meshctl.tunnels).
RT_PROTO_TUNNEL = 0x6E  # 110, unassigned as well

"""meshctl: a multi-cloud, multi-cluster network mesh for Kubernetes."""

__version__ = "0.1.0"

# Routes the agent installs carry this protocol number so it removes only its own.
RT_PROTO = 0x6D  # 109, unassigned in /etc/iproute2/rt_protos

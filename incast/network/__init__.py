"""The emulated network: Mininet topologies loaded from topologies/ and each host's
TCP and NIC configuration (the data planes are incast.dataplane)."""

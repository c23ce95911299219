"""The machine a run uses: what its kernel can do (probe), every ip/tc/ethtool
command (netdev), and what a run creates and removes (resources)."""

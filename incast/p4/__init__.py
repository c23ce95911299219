"""What Python shares with p4src/incast.p4: constants read from its source (program)
and the Scapy layers of its frames (layers), used by the collector and the P4 tests alike."""

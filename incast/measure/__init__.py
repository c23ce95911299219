"""Instruments and their tables: queue telemetry, the link monitor and fidelity,
packet capture, and the results directory every run writes."""

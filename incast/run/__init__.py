"""Running scenarios: one run (experiment), calibration, sweeps and campaigns."""

"""incast: a testbed that reproduces, measures and teaches TCP incast."""
__version__ = "0.1.0"

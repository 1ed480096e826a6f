"""Benchmarks of the videokv memory engine: ``python -m bench.run`` (or ``make bench``).

Everything here drives the library through its public API; nothing in it is
imported by the library or the node.
"""

"""Benchmark scripts (run as ``python benchmarks/NAME.py`` from a checkout)."""

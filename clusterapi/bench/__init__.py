"""Benchmarks of the console (``python -m clusterapi.bench.linkload``)."""

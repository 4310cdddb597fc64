"""Benchmarks: `make bench` runs every `bench/bench_*.py` module and prints one table."""

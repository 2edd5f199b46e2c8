"""Benchmarks of the gateway and the real-engine trace replay (run by `polyhead bench`)."""

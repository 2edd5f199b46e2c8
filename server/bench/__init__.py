"""Benchmarks of the gateway and the real-engine trace replay (`polyhead bench gateway|replay`)."""

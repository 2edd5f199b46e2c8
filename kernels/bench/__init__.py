"""Benchmarks of the unembedding kernels (run by `polyhead bench kernels` and gpu.sh)."""

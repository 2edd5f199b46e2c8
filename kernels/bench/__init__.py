"""Benchmarks of the unembedding kernels (`polyhead bench kernels`; gpu.sh on a CUDA box)."""

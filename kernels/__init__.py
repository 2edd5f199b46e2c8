"""Unembedding and sampling kernels. Import submodules explicitly; this file stays side-effect free
because transformers probes for a PyPI package of the same name."""

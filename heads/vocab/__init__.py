"""Vocabularies: the per-head tokenizer, split tables, trimming into Matryoshka order, script
classes and the prompt encoder (torch-free: the gateway imports these)."""

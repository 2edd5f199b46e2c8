"""The multi-head model: checkpoint format, tokenizers, backbones and the local engine."""

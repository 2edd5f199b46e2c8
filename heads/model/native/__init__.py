"""Fused CPU ops for the decoder step: a C++ library built once per machine and loaded into
`torch.ops.polyhead` (heads.model.native.build)."""

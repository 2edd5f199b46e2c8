"""The model: attention, the Llama and Gemma-3 backbones, MultiHeadModel with its head
adapters, a checkpoint's weights (load, save) and a forward pass outside the engine."""

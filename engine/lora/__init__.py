"""LoRA adapters on the attention and MLP projections, several resident at once (see docs/lora.md)."""

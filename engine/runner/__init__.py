"""The model runner: the persistent input batch, the per-step inputs, the forward pass and the
sampling call; it owns the model, the KV cache and the device."""

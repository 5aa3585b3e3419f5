"""KV cache events in vLLM's wire format, published over ZMQ (docs/scale-out.md)."""

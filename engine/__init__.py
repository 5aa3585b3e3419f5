"""The inference engine: scheduler, paged KV cache, model runner, models and sampler."""

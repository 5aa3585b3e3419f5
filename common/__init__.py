"""What all three processes share, with no torch import: the cross-process messages, the IPC
queues and child-process life, the engine's config and the CLI generated from it, request
validation and its one error type, what a model folder says about generation (EOS ids, sampling
defaults), the n-choice fan-out, and where the default model lives."""

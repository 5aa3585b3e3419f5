"""Our own PyTorch implementations of the supported model families."""

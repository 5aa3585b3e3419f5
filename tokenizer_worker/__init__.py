"""The tokenizer worker process: chat template, tokenize, incremental detokenize, stop strings."""

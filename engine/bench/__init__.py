"""Benchmarks of the engine against transformers, and the machine limits they are read against."""

"""Sampling on the device: persistent per-row state (`state.py`), the filters (`filters.py`) and
the sampler that runs them in the documented order (`sampler.py`)."""

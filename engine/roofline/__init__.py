"""The roofline of a model step: per-operator FLOPs and bytes (`cost_model`) against a machine's
peak FLOP/s and bandwidth (`machine`, `measure`), as a table (`python -m engine.roofline`) and,
for every step the engine runs, as utilization metrics (`step_account`)."""

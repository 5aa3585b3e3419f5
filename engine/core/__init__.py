"""The engine's scheduling layer: requests, the block manager and the scheduler. No torch here:
it decides what runs and reads back what was sampled, through plain structs (`outputs.py`)."""

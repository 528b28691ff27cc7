"""The adapter for verl's legacy trainer: ``RayExGRPOTrainer(RayPPOTrainer)`` and its generation with per-prompt
sample counts."""

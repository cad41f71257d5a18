"""The trainer: GRPO on LoRA adapters, from the trajectories the gateway records. Imports torch; the gateway never imports this package."""

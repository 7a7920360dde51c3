"""The shared trainer: one frozen base model, one LoRA adapter, optimizer and schedule per run."""

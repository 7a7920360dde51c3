"""The shared trainer: one frozen base model, one LoRA adapter, optimizer and schedule per run.

By concern, from the top: `rl/` (the trainer process and its update: packing, loss,
per-run statistics), `losses/` (policy losses by name, the place to add one), `runs/`
(slots, checkpoints, published adapters, divergence), `optim/` (per-run AdamW and
schedules), `lora/` (the multi-adapter layer and its op), `compute/` (the frozen base's
forward over packed rows, its attention paths, log-prob head and FSDP2 sharding),
`parallel/` (ranks, torchrun launch, rendezvous) and `sft/` (supervised fine-tuning and
the built-in model it builds). `transfer` (host-to-device copies) and `row_threads` (rows
computed side by side on the CPU) serve several of them.
"""

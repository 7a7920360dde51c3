"""Each run's life in the trainer: its slot, its checkpoints, its published adapters.

`manager` is the multi-run manager (which run holds which adapter slot, on every rank:
prime-rl's `MultiRunManager`); `checkpoint` writes and resumes a run's trainer checkpoint;
`init_adapter` starts a run from a peft adapter (`lora.init_from`); `broadcast` writes a
run's adapter as a peft directory after each step and `publisher` does it off the
update's critical path; `divergence` stops a run whose loss or gradients stop being
finite and never writes its non-finite weights.
"""

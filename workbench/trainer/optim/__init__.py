"""Per-run optimizers and learning-rate schedules (`per_run`), and every ready run's
gradient clipping and AdamW step computed at once (`multi_adamw`)."""

"""The multi-adapter LoRA layer (`layer`: one frozen base linear, one adapter slot per
run) and the multi-run LoRA product as one torch op with its kernel choice (`ops`)."""

"""Supervised fine-tuning and the built-in model it makes.

`train` fine-tunes a model (full or LoRA) on (prompt, completion) pairs; `flow` is
`workbench sft` from command-line settings to a saved model; `tiny_reverse` builds the
built-in `builtin:tiny-reverse` models by an SFT warm-up of a randomly initialised Llama.
"""

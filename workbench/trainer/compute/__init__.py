"""How the frozen base model computes a packed row, and where it lies.

`model` applies the trainer's compute settings to a Hugging Face model (attention path,
activation checkpointing, compilation) and gives a packed row's log-probs; `attention`,
`attention_choice` and `flex_mask` are the packed-row attention paths and the choice
between them; `lm_head` gives next-token log-probs a chunk of tokens at a time; `sharding`
lays the base over the ranks, whole on each or sharded by FSDP2.
"""

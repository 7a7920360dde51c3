"""The trainer's ranks and how they start: `distributed` (device, process group, the
master's rows shared out, sums over ranks), `launch` (torchrun with a clean stop:
`python -m workbench.trainer.parallel.launch`) and `rendezvous` (a rendezvous store
bound to one address)."""

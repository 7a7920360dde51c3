"""workbench: several LoRA RL experiments at once on one machine."""

__version__ = "0.1.0"

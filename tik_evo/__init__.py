"""tik-evo: evolve faster GPU kernels whose full-sequence and decode paths agree bit for bit."""

__version__ = "0.1.0"

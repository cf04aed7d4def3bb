from kernels.rope.family import RoPEFamily

FAMILY = RoPEFamily()

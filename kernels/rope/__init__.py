from tik_evo_kernels.rope.family import RoPEFamily

FAMILY = RoPEFamily()

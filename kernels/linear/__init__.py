from tik_evo_kernels.linear.family import LinearFamily

FAMILY = LinearFamily()

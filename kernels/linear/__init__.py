from kernels.linear.family import LinearFamily

FAMILY = LinearFamily()

from kernels.attention.family import AttentionFamily

FAMILY = AttentionFamily()

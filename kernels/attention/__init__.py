from tik_evo_kernels.attention.family import AttentionFamily

FAMILY = AttentionFamily()

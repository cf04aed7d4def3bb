from tik_evo_kernels.silu_mul.family import SiluMulFamily

FAMILY = SiluMulFamily()

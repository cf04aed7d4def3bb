from kernels.silu_mul.family import SiluMulFamily

FAMILY = SiluMulFamily()

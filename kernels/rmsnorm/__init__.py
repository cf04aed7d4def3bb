from tik_evo_kernels.rmsnorm.family import RMSNormFamily

FAMILY = RMSNormFamily()

from kernels.rmsnorm.family import RMSNormFamily

FAMILY = RMSNormFamily()

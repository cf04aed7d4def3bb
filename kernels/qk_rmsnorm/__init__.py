from kernels.qk_rmsnorm.family import QKRMSNormFamily

FAMILY = QKRMSNormFamily()

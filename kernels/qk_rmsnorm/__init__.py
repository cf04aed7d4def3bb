from tik_evo_kernels.qk_rmsnorm.family import QKRMSNormFamily

FAMILY = QKRMSNormFamily()

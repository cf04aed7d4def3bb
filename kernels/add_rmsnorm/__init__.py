from kernels.add_rmsnorm.family import AddRMSNormFamily

FAMILY = AddRMSNormFamily()

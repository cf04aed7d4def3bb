from tik_evo_kernels.add_rmsnorm.family import AddRMSNormFamily

FAMILY = AddRMSNormFamily()

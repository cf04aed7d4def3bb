from tik_evo_kernels.kv_append.family import KVAppendFamily

FAMILY = KVAppendFamily()

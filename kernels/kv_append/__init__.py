from kernels.kv_append.family import KVAppendFamily

FAMILY = KVAppendFamily()

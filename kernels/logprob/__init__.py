from tik_evo_kernels.logprob.family import LogprobFamily

FAMILY = LogprobFamily()

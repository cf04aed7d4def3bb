from kernels.logprob.family import LogprobFamily

FAMILY = LogprobFamily()

from kernels.moe_routing.family import MoERoutingFamily

FAMILY = MoERoutingFamily()

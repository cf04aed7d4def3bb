from tik_evo_kernels.moe_routing.family import MoERoutingFamily

FAMILY = MoERoutingFamily()

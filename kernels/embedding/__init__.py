from tik_evo_kernels.embedding.family import EmbeddingFamily

FAMILY = EmbeddingFamily()

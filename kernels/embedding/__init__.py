from kernels.embedding.family import EmbeddingFamily

FAMILY = EmbeddingFamily()

/* cuda/topk.cu — CUDA kernels of the topk codec (being written). */

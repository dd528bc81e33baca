/* cuda/terngrad.cu — CUDA kernels of the terngrad codec (being written). */

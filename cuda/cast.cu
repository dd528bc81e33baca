/* cuda/cast.cu — CUDA kernels of the cast codecs (being written). */

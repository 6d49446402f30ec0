"""Native kernels for the CPU engine (qgemv: quantized batch-1 GEMV), each with a torch fallback."""

"""Quantized weights kept quantized: GGUF block decoding and the CPU matmuls that read the codes directly."""

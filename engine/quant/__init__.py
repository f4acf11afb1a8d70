"""Quantized weights: how checkpoints' quantized tensors are read (``hf_formats``), the in-memory
weight types the model's linear layers run on (``fp8``, ``int4``), and the kernels they call
(kernels/quant_linear.py on CUDA, their torch twins in kernels/quant_reference.py elsewhere)."""

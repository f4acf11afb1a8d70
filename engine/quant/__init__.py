"""Quantized weights: GGUF blocks kept quantized with the CPU matmuls that read their codes
(``gguf_blocks``, ``cpu_linear``, ``cpu_ext``); how checkpoints' quantized tensors are read
(``hf_formats``) and the weight types the model's linear layers run on the GPU (``fp8``, ``int4``), whose
kernels are kernels/quant_linear.py on CUDA and their torch twins in kernels/quant_reference.py elsewhere."""

"""Qwen2.5-Omni's token2wav as a streaming head: codec codes in, waveform chunks out."""

"""Qwen3-Omni's code2wav head: the talker's frames of codes -> waveform, streamed chunk by chunk."""

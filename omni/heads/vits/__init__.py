"""Hugging Face ``VitsModel`` as a batched synthesizer for the TTS head."""

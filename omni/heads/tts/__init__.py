"""The streaming TTS head: text deltas in, pcm16 chunks out, synthesized in shared batches."""

"""Analysis tools: they read what a benchmark recorded (traces, timelines, compiled kernels, results) and print
what it says.
"""

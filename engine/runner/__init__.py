"""Running the model: one step's flattened batch, attention backends, CUDA graphs, sampling, loading weights and
warming up.
"""

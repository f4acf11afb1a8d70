"""Tensor parallel: one model split over the devices of one machine, one process per rank.

``layout`` says which heads, MLP columns and vocabulary rows each rank holds (pure arithmetic);
``weights`` reads exactly those slices; ``context`` holds a rank's process groups and the
collectives the model calls; ``executor`` (rank 0, in the engine's process) spawns the ranks
(``worker``) and broadcasts each step to them.
"""

"""One-off experiments that answered a single question; each docstring gives the question and the answer."""

"""Front ends and processes: the offline ``LLM``, the streaming ``AsyncEngine``, the engine core in its own
process, replicas and the router, chat rendering.
"""

"""Stage 1, steps -> episodes: the pure episode state machine, its commit protocol, the Faust
agent and the gap reader.
"""

"""Stage 3, episodes -> GRPO groups: the pure group state machine, advantages, group rows and
the groups stage.
"""

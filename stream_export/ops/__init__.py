"""The worker and what operators see: wiring, HTTP endpoints, status page, health, preflight,
the demo fleet.
"""

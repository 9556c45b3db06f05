"""The router engine: scheduler, supervisor and their single owner.

Framework-free on purpose (DESIGN §3): nothing under this package imports Django, Channels,
Celery or Redis, so the engine can be tested with a fake clock and reused by any adapter.
"""

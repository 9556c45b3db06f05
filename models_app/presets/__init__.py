"""The preset store: import and export files, sources (INI, models dir), the server's
options, and the engine's specs built from it. docs/architecture.md.
"""

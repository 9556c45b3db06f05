"""The HTTP servers ``serve`` runs the application on: Daphne (default) and uvicorn, each
set up by an explicit ``install()``. docs/architecture.md.
"""

"""The browser side: views, forms, the dashboard's sockets and what they show.
docs/architecture.md.
"""

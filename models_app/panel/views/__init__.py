"""The panel's server-rendered pages (DESIGN §7); one module per area.

Every view is wrapped in ``roles.require(role)``; every form carries a CSRF token (Django's
middleware refuses a POST without one). Live updates come over ``consumers.DashboardConsumer``.
"""

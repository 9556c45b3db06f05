"""The team: roles, sign-in, usage and quotas' records, reservations. docs/architecture.md."""

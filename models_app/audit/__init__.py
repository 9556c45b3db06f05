"""The audit log: rows written by the panel (records), by the router (writer, journal,
mapper) and read back (labels). docs/architecture.md.
"""

"""What tests share: stand-ins (a fake router, a panel router stub), recorders and builders.

Tests import helpers from here, never from another test module.
"""

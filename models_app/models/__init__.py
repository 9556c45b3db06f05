"""RouterPanel's stored state, one concept per module; every name is importable from here, as
Django (and every caller, and the migrations' dotted paths) expect:

* ``presets``: ``Preset``, ``PresetSource`` and which program a preset runs (``catalogue_for``);
* ``validators``: the checks of a preset's values (migrations name them ``models_app.models.*``);
* ``settings``: ``RouterSettings`` (one row) and ``ConfigChange`` (the configuration's version);
* ``nodes``: ``NodeSettings``, one node's capacity (several hosts);
* ``keys``: ``ApiKey``, its scope and ``Quota``;
* ``usage``: ``UsageRecord`` and ``UsageHour``;
* ``audit``: ``AuditKind`` and the append-only ``AuditEvent``;
* ``reservations``: ``Reservation``;
* ``memory``: ``MemoryRollup``, the memory chart's minutes;
* ``base``: what they share (``TextChoices`` as mypy sees it, the control characters).

The modules import ``base`` and ``validators``; ``presets`` imports ``settings``; none imports
this package.
"""

from models_app.models.audit import AuditEvent, AuditEventQuerySet, AuditKind
from models_app.models.base import TextChoices
from models_app.models.keys import (
    ApiKey,
    ApiKeyQuerySet,
    KeyPriority,
    Quota,
    hash_api_key,
    parse_model_patterns,
    patterns_allow,
    validate_model_patterns,
)
from models_app.models.memory import MemoryRollup, MemoryRollupQuerySet
from models_app.models.nodes import NodeSettings
from models_app.models.presets import (
    Preset,
    PresetSource,
    catalogue_for,
    default_program,
    program_for,
)
from models_app.models.reservations import Reservation
from models_app.models.settings import DEFAULT_MAX_WAIT, ConfigChange, RouterSettings
from models_app.models.usage import UsageHour, UsageRecord
from models_app.models.validators import (
    PAIR_RESERVED_KEYS,
    validate_aliases,
    validate_args,
    validate_env,
    validate_model_id,
    validate_nodes,
    validate_pairs,
    validate_server_bin,
)

__all__ = [
    "DEFAULT_MAX_WAIT",
    "PAIR_RESERVED_KEYS",
    "ApiKey",
    "ApiKeyQuerySet",
    "AuditEvent",
    "AuditEventQuerySet",
    "AuditKind",
    "ConfigChange",
    "KeyPriority",
    "MemoryRollup",
    "MemoryRollupQuerySet",
    "NodeSettings",
    "Preset",
    "PresetSource",
    "Quota",
    "Reservation",
    "RouterSettings",
    "TextChoices",
    "UsageHour",
    "UsageRecord",
    "catalogue_for",
    "default_program",
    "hash_api_key",
    "parse_model_patterns",
    "patterns_allow",
    "program_for",
    "validate_aliases",
    "validate_args",
    "validate_env",
    "validate_model_id",
    "validate_model_patterns",
    "validate_nodes",
    "validate_pairs",
    "validate_server_bin",
]

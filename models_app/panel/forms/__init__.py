"""The panel's forms, one concept a module: shared fields (fields.py), a preset's key/value rows
(pairs.py), presets (preset.py), router and node settings (settings.py), INI import
(ini_import.py), audit filters (audit_filter.py), API keys (keys.py), users (users.py), quotas
(quota.py) and reservations (reservation.py). Validation lives in the models where it can
(``Preset.clean``, field validators); these forms add what a form needs on top: sizes written as
``8G``, rows instead of JSON, and checks that span rows or presets.

Every form is named here, so a view imports it from ``models_app.panel.forms``.
"""

from models_app.panel.forms.audit_filter import AuditFilterForm
from models_app.panel.forms.fields import TRISTATE, SizeField, TriStateField
from models_app.panel.forms.ini_import import MAX_INI_BYTES, ImportForm
from models_app.panel.forms.keys import ApiKeyForm, KeyScopeForm
from models_app.panel.forms.pairs import (
    BasePairFormSet,
    PairFormSet,
    PairRowForm,
    option_names,
    pair_formset,
)
from models_app.panel.forms.preset import PresetForm
from models_app.panel.forms.quota import QuotaForm
from models_app.panel.forms.reservation import ReservationForm
from models_app.panel.forms.settings import NodeSettingsForm, SettingsForm
from models_app.panel.forms.users import ROLE_CHOICES, NewUserForm, RoleForm

__all__ = [
    "MAX_INI_BYTES", "ROLE_CHOICES", "TRISTATE", "ApiKeyForm", "AuditFilterForm", "BasePairFormSet",
    "ImportForm", "KeyScopeForm", "NewUserForm", "NodeSettingsForm", "PairFormSet", "PairRowForm",
    "PresetForm", "QuotaForm", "ReservationForm", "RoleForm", "SettingsForm", "SizeField",
    "TriStateField", "option_names", "pair_formset",
]  # fmt: skip

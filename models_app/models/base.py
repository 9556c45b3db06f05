"""What the model modules share: the ``TextChoices`` base as mypy sees it, and the control
characters no stored name may contain."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar

from django.db import models

if TYPE_CHECKING:
    from enum import StrEnum

    class TextChoices(StrEnum):
        """What Django's ``models.TextChoices`` is at run time, told to mypy (Django has no
        types here): a str enum whose members are ``VALUE = "value", "label"``."""

        choices: ClassVar[list[tuple[str, str]]]

        @property
        def label(self) -> str: ...

else:
    TextChoices = models.TextChoices

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")

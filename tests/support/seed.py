"""The run's one Hypothesis seed (chosen in tests/conftest.py, printed in pytest's header)."""

from __future__ import annotations

import os
import random

SEED_VARIABLE = "ROUTERPANEL_HYPOTHESIS_SEED"


def run_seed(given: object = None) -> int:
    """The run's seed: ``given`` (``--hypothesis-seed``), else the variable, else a new one.

    The variable is set on first use, so xdist's workers (started later) inherit the same one.
    """
    if given is not None:
        os.environ[SEED_VARIABLE] = str(int(str(given)))
    return int(os.environ.setdefault(SEED_VARIABLE, str(random.randrange(2**32))))

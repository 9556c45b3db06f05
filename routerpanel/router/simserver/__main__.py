"""Run the simulated llama-server: ``python -m routerpanel.router.simserver [flags]``."""

from __future__ import annotations

import sys

from routerpanel.router.simserver.process import main

if __name__ == "__main__":
    sys.exit(main())

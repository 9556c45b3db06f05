#!/usr/bin/env python
"""Django's command-line utility for RouterPanel."""

import os
import sys


def apply_data_dir(argv: list[str]) -> None:
    """Honour ``--data-dir DIR`` before the settings are read (they create the data dir)."""
    for index, arg in enumerate(argv):
        if arg == "--data-dir" and index + 1 < len(argv):
            os.environ["ROUTERPANEL_DATA_DIR"] = argv[index + 1]
        elif arg.startswith("--data-dir="):
            os.environ["ROUTERPANEL_DATA_DIR"] = arg.split("=", 1)[1]


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
    apply_data_dir(sys.argv)
    from routerpanel import reactor

    reactor.prepare(sys.argv)  # serve on Daphne: Twisted's reactor on uvloop, before Django's setup
    from django.core.management import execute_from_command_line

    from routerpanel.env import EnvError

    try:
        execute_from_command_line(sys.argv)
    except EnvError as exc:
        # A variable that does not parse (the settings read them at import): the message names
        # it, and a traceback would only bury that line.
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()

#!/bin/sh
# Print the newest Python RouterPanel supports (3.13, 3.12, then 3.11) that runs on this machine.
# A candidate must really start: pyenv puts shims on PATH for versions it will then refuse to run.
# Used by the Makefile when PYTHON is not given; exits 1 (printing nothing) when none is found.
for candidate in python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
    "$candidate" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' \
      >/dev/null 2>&1; then
    "$candidate" -c 'import sys; print(sys.executable)'
    exit 0
  fi
done
exit 1

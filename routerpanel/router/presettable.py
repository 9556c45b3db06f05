"""The presets the engine runs on: the current table, its aliases, and removed presets whose
child still runs (A14), kept until the scheduler forgets them.

``replace`` installs a new table (a reload); the old one is never changed in place, so a reader
may keep a reference to ``current`` and tell a new table by its identity (hangs.py does).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from routerpanel.router.config import PresetSpec, preset_map


class PresetTable:
    """The current presets by name, their aliases, and the retired ones (see module doc)."""

    def __init__(self, presets: Iterable[PresetSpec]) -> None:
        self.current = preset_map(presets)
        self._aliases = alias_map(self.current)
        self._retired: dict[str, PresetSpec] = {}  # removed presets whose child still runs

    def spec(self, name: str) -> PresetSpec | None:
        """Return the current or retired preset named ``name``, or None."""
        return self.current.get(name) or self._retired.get(name)

    def resolve(self, name_or_alias: str) -> str | None:
        """Return the preset name for a name or alias, or None."""
        if name_or_alias in self.current:
            return name_or_alias
        return self._aliases.get(name_or_alias)

    def replace(self, presets: Iterable[PresetSpec]) -> None:
        """Install a new table; presets it drops are retired until their child is gone."""
        old, self.current = self.current, preset_map(presets)
        self._aliases = alias_map(self.current)
        self._retired.update({n: s for n, s in old.items() if n not in self.current})

    def forget_retired(self, known: Collection[str]) -> list[str]:
        """Drop the retired presets not in ``known`` (the scheduler's models); return them."""
        gone = [name for name in self._retired if name not in known]
        for name in gone:
            del self._retired[name]
        return gone

    def every(self) -> list[PresetSpec]:
        """Every preset, current and retired (each may have a child to stop)."""
        return [*self.current.values(), *self._retired.values()]


def alias_map(specs: dict[str, PresetSpec]) -> dict[str, str]:
    return {alias: spec.name for spec in specs.values() for alias in spec.aliases}

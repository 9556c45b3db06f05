"""From the database to what the engine runs: RouterConfig and PresetSpec."""

from __future__ import annotations

from pathlib import Path

import pytest

from models_app.models import Preset, RouterSettings
from models_app.presets import sources, specs
from models_app.presets.files import import_presets

pytestmark = pytest.mark.django_db

FILE = """[*]
c = 4096
stop-timeout = 5
ttl = 600

[org/m:Q4_K_M]
model = /models/m.gguf
no-warmup = 1
alias = m,mm
stop-timeout = 2
memory = 1G

[sim]
server-bin = python3 -m routerpanel.router.simserver
sim-load-ms = 100
pinned = true
env.SIM = 1

[off]
enabled = false
"""


def by_name() -> dict[str, object]:
    row = RouterSettings.load()
    return {s.name: s for s in specs.preset_specs(list(Preset.objects.all()), row)}


def test_it_merges_the_global_section_and_the_stored_defaults() -> None:
    import_presets(FILE)
    found = by_name()
    assert set(found) == {"org/m:Q4_K_M", "sim"}  # disabled presets are not served
    model = found["org/m:Q4_K_M"]
    assert model.argv[0] == "llama-server"  # type: ignore[attr-defined]
    assert "--no-warmup" in model.argv and "--ctx-size" in model.argv  # type: ignore[attr-defined]
    assert (model.stop_timeout, model.ttl, model.memory_estimate) == (2.0, 600.0, 1 << 30)  # type: ignore[attr-defined]
    assert model.aliases == ("m", "mm")  # type: ignore[attr-defined]
    assert model.speaks_child_protocol is True  # type: ignore[attr-defined]


def test_another_program_gets_its_own_flags_env_and_inherited_values() -> None:
    import_presets(FILE)
    sim = by_name()["sim"]
    assert sim.argv[:3] == ("python3", "-m", "routerpanel.router.simserver")  # type: ignore[attr-defined]
    assert "--sim-load-ms" in sim.argv  # type: ignore[attr-defined]
    assert (sim.stop_timeout, sim.pinned) == (5.0, True)  # type: ignore[attr-defined]
    assert dict(sim.env) == {"SIM": "1"}  # type: ignore[attr-defined]
    assert sim.speaks_child_protocol is True  # type: ignore[attr-defined]


def test_the_stored_default_stop_timeout_applies_when_nobody_sets_one() -> None:
    Preset.objects.create(name="plain", model_path="/x.gguf")
    row = RouterSettings.load()
    row.default_stop_timeout = 7
    row.save()
    assert by_name()["plain"].stop_timeout == 7.0  # type: ignore[attr-defined]


def test_overrides_win_over_stored_settings() -> None:
    Preset.objects.create(name="plain", model_path="/x.gguf")
    row = RouterSettings.load()
    config = specs.router_config(row, specs.Overrides(models_max=2))
    assert config.models_max == 2
    spec = specs.preset_specs(
        list(Preset.objects.all()), row, specs.Overrides(server_bin="/opt/ls")
    )
    assert spec[0].argv[0] == "/opt/ls"


def test_the_advertised_address_and_child_keys_reach_the_engine() -> None:
    row = RouterSettings.load()
    plain = specs.router_config(row)
    assert (plain.child_host, plain.child_keys) == ("127.0.0.1", False)
    keyed = specs.router_config(row, specs.Overrides(advertise="10.0.0.5", child_keys=True))
    assert (keyed.child_host, keyed.child_keys) == ("10.0.0.5", True)
    assert specs.router_config(row, specs.Overrides(advertise="[fd00::5]")).child_host == "fd00::5"


def test_an_unknown_program_is_polled_on_health() -> None:
    assert specs.speaks_child_protocol(("/usr/bin/vllm-serve",)) is False
    assert specs.speaks_child_protocol(("/opt/llama.cpp/build/bin/llama-server",)) is True


class TestModelsDir:
    def test_it_finds_models_like_llama_cpp(self, tmp_path: Path) -> None:
        (tmp_path / "a-Q4_K_M.gguf").write_bytes(b"")
        (tmp_path / "mmproj-a.gguf").write_bytes(b"")
        (tmp_path / "mtp-draft.gguf").write_bytes(b"")
        (tmp_path / "notes.txt").write_text("")
        sub = tmp_path / "vision"
        sub.mkdir()
        (sub / "model-00001-of-00002.gguf").write_bytes(b"")
        (sub / "model-00002-of-00002.gguf").write_bytes(b"")
        (sub / "mmproj-f16.gguf").write_bytes(b"")
        (tmp_path / "empty").mkdir()
        found = sources.scan_models_dir(str(tmp_path))
        assert [(m.name, Path(m.model).name) for m in found] == [
            ("a-Q4_K_M", "a-Q4_K_M.gguf"),
            ("vision", "model-00001-of-00002.gguf"),
        ]
        assert Path(found[1].mmproj).name == "mmproj-f16.gguf"

    def test_a_missing_dir_gives_llama_cpps_message(self, tmp_path: Path) -> None:
        with pytest.raises(sources.SourceError, match="does not exist or is not a directory"):
            sources.scan_models_dir(str(tmp_path / "nope"))

    def test_import_creates_presets(self, tmp_path: Path) -> None:
        (tmp_path / "b.gguf").write_bytes(b"")
        assert sources.import_models_dir(str(tmp_path)) == ["b"]
        assert Preset.objects.get(name="b").model_path == str(tmp_path / "b.gguf")


def test_demo_presets_run_the_simulated_server() -> None:
    names = sources.ensure_demo_presets()
    assert names == ["demo-small", "demo-medium", "demo-large"]
    found = by_name()
    assert all("routerpanel.router.simserver" in found[n].argv for n in names)  # type: ignore[attr-defined]
    assert found["demo-large"].memory_estimate == 768 << 20  # type: ignore[attr-defined]


NODE_FILE = """[anywhere]
model = /models/a.gguf

[studio-only]
model = /models/s.gguf
node = studio-1,studio-2

[laptop-only]
model = /models/l.gguf
node = laptop
"""


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("", {"anywhere", "studio-only", "laptop-only"}),  # the single router: every preset
        ("studio-2", {"anywhere", "studio-only"}),
        ("laptop", {"anywhere", "laptop-only"}),
        ("elsewhere", {"anywhere"}),
    ],
)
def test_a_router_with_a_node_name_knows_only_the_presets_eligible_on_it(
    node: str, expected: set[str]
) -> None:
    import_presets(NODE_FILE)
    _, found = specs.load_specs(specs.Overrides(node=node))
    assert {s.name for s in found} == expected
    nodes = {s.name: s.nodes for s in found}
    if "studio-only" in nodes:
        assert nodes["studio-only"] == ("studio-1", "studio-2")
    assert nodes["anywhere"] == ()

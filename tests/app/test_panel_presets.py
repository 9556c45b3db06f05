"""The preset pages: the form with its field and row errors, clone, delete, pin, INI import and
export. Each change is audited and makes the router reload its presets."""

from __future__ import annotations

import pytest
from django.test import Client

from models_app.models import AuditEvent, AuditKind, Preset, RouterSettings
from models_app.panel.views import common
from tests.support.opened import opened
from tests.support.panel import RouterStub, model_row
from tests.support.preset_form import form

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


class TestCreate:
    def test_it_shows_field_errors_then_creates_the_preset(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        bad = form(args=[("ctx-sizee", "4096")], name="org/tiny:q8_0", ttl="-1")
        response = admin_client.post("/presets/new/", bad)
        assert response.status_code == 200
        text = response.content.decode()
        assert "use &#x27;org/tiny:Q8_0&#x27;" in text  # the model id, in llama.cpp's spelling
        assert "llama-server has no option &#x27;ctx-sizee&#x27;" in text  # on its row
        assert "Ensure this value is greater than or equal to 0." in text
        assert 'value="ctx-sizee"' in text  # what was typed is kept
        assert not Preset.objects.exists() and not panel_router.of_kind("reload")

        good = form(args=[("ctx-size", "4096"), ("temp", "0.7")], aliases_text="tiny, small")
        response = admin_client.post("/presets/new/", good | {"stop_timeout": "15", "memory": "2G"})
        assert response.status_code == 302
        preset = Preset.objects.get()
        assert response["Location"] == f"/presets/{preset.pk}/"
        assert preset.name == "org/tiny:Q8_0"
        assert preset.args == [["ctx-size", "4096"], ["temp", "0.7"]]
        assert (preset.aliases, preset.stop_timeout, preset.memory_estimate) == (
            ["small", "tiny"],
            15,
            2 << 30,
        )
        assert preset.updated_by.username == "ada"
        row = AuditEvent.objects.get(kind=AuditKind.PRESET_CREATED)
        assert (row.model, row.actor) == ("org/tiny:Q8_0", "user:ada")
        assert panel_router.of_kind("reload") == [{"actor": "user:ada"}]

    @pytest.mark.parametrize("value", ["-1", "soon", "nan"])
    def test_a_hang_timeout_that_is_not_a_non_negative_number_is_a_field_error(
        self, admin_client: Client, panel_router: RouterStub, value: str
    ) -> None:
        response = admin_client.post("/presets/new/", form(hang_timeout=value))
        assert response.status_code == 200
        errors = response.context["form"].errors
        assert list(errors) == ["hang_timeout"], errors
        assert not Preset.objects.exists()

    def test_a_hang_timeout_is_saved_and_zero_turns_the_watchdog_off(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        assert admin_client.post("/presets/new/", form(hang_timeout="2.5")).status_code == 302
        assert Preset.objects.get().hang_timeout == 2.5
        from models_app.presets.specs import load_specs

        _, specs = load_specs()
        assert specs[0].hang_timeout == 2.5
        Preset.objects.update(hang_timeout=0)
        _, specs = load_specs()
        assert specs[0].hang_timeout is None  # off
        Preset.objects.update(hang_timeout=None)
        _, specs = load_specs()
        assert specs[0].hang_timeout == 60.0  # the router settings' default

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("studio 1", "Node name &#x27;studio 1&#x27; may only use letters, digits"),
            ("a, b, a", "Node &#x27;a&#x27; is named twice."),
            ("a,,b", "A node name is empty (between two commas)."),
        ],
    )
    def test_a_malformed_node_list_is_a_field_error(
        self, admin_client: Client, panel_router: RouterStub, value: str, message: str
    ) -> None:
        response = admin_client.post("/presets/new/", form(nodes=value))
        assert response.status_code == 200
        errors = response.context["form"].errors
        assert list(errors) == ["nodes"], errors
        text = response.content.decode()
        assert 'id="id_nodes-errors"' in text and message in text
        assert not Preset.objects.exists()

    def test_nodes_are_saved_in_one_spelling_and_shown_on_the_detail_page(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        edit = admin_client.get("/presets/new/").content.decode()
        assert 'name="nodes"' in edit and "Empty: any node." in edit
        response = admin_client.post("/presets/new/", form(nodes=" studio-2 , studio-1"))
        assert response.status_code == 302
        preset = Preset.objects.get()
        assert preset.nodes == "studio-1,studio-2"
        detail = admin_client.get(f"/presets/{preset.pk}/").content.decode()
        assert '<dd id="preset-nodes">studio-1, studio-2</dd>' in detail
        row = AuditEvent.objects.get(kind=AuditKind.PRESET_CREATED)
        assert row.details["changes"]["nodes"] == [None, "studio-1,studio-2"]
        Preset.objects.update(nodes="")
        detail = admin_client.get(f"/presets/{preset.pk}/").content.decode()
        assert '<dd id="preset-nodes">any node</dd>' in detail

    def test_rows_reject_a_key_given_twice_and_options_with_their_own_field(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        response = admin_client.post(
            "/presets/new/", form(args=[("temp", "1"), ("temp", "2"), ("alias", "x")])
        )
        text = response.content.decode()
        assert response.status_code == 200
        assert "temp is given twice." in text
        assert "alias has its own field" in text
        assert not Preset.objects.exists()

    def test_a_value_without_a_name_is_an_error_on_its_row(self, admin_client: Client) -> None:
        response = admin_client.post("/presets/new/", form(env=[("", "1")]))
        assert response.status_code == 200
        assert "Give this value a name." in response.content.decode()

    def test_the_form_offers_llama_cpp_option_names(self, admin_client: Client) -> None:
        text = admin_client.get("/presets/new/").content.decode()
        assert '<option value="ctx-size">' in text and '<option value="n-gpu-layers">' in text


class TestSourceAndServerBinary:
    def test_the_detail_page_says_where_the_preset_came_from(
        self, viewer_client: Client, panel_router: RouterStub
    ) -> None:
        made = Preset.objects.create(name="made")
        owned = Preset.objects.create(
            name="owned", source="models_preset", source_path="/srv/models.ini"
        )
        text = viewer_client.get(f"/presets/{made.pk}/").content.decode()
        assert '<dd id="preset-source">made in the panel</dd>' in text
        text = viewer_client.get(f"/presets/{owned.pk}/").content.decode()
        assert "the --models-preset file <code>/srv/models.ini</code>" in text
        assert "A reload that no longer finds it there removes it" in text

    def test_rows_are_checked_against_the_global_server_binary(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        row = RouterSettings.load()
        row.global_args = [["server-bin", "python3 -m routerpanel.router.simserver"]]
        row.save()
        response = admin_client.post("/presets/new/", form(args=[("sim-load-ms", "5")]))
        assert response.status_code == 302
        response = admin_client.post("/presets/new/", form(args=[("ctx-sizee", "1")], name="other"))
        assert "has no option &#x27;ctx-sizee&#x27;" in response.content.decode()

    def test_an_unreadable_binary_saves_with_a_warning(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        body = form(args=[("fit-budget", "3")], server_bin="/opt/nowhere/llama-server")
        response = admin_client.post("/presets/new/", body, follow=True)
        text = response.content.decode()
        assert Preset.objects.get().args == [["fit-budget", "3"]]
        assert "option &#x27;fit-budget&#x27; is not checked" in text


def url(preset: Preset) -> str:
    return f"/presets/{preset.pk}/edit/"


class TestEdit:
    @pytest.fixture
    def preset(self) -> Preset:
        return Preset.objects.create(name="demo", model_path="/m/demo.gguf", args=[["temp", "1"]])

    def test_a_running_model_says_it_will_restart_and_when(
        self, admin_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        panel_router.models = [model_row("demo", "loaded", in_flight=2)]
        text = admin_client.get(f"/presets/{preset.pk}/edit/").content.decode()
        assert "demo is loaded with 2 requests in flight." in text
        assert "once its in-flight requests finish" in text

        panel_router.answers["reload"] = common.Answer(body={"restarted": ["demo"]})
        body = form(args=[("temp", "0.2")], name="demo") | opened(admin_client, url(preset))
        response = admin_client.post(url(preset), body, follow=True)
        assert "demo is running with the old command line: it restarts now" in (
            response.content.decode()
        )
        preset.refresh_from_db()
        assert preset.args == [["temp", "0.2"]]
        row = AuditEvent.objects.get(kind=AuditKind.PRESET_CHANGED)
        assert row.details["changes"]["args"] == [[["temp", "1"]], [["temp", "0.2"]]]

    def test_an_idle_model_restarts_right_away(
        self, admin_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        panel_router.models = [model_row("demo", "loaded")]
        text = admin_client.get(f"/presets/{preset.pk}/edit/").content.decode()
        assert "right away, as it is idle" in text

    def test_the_router_being_down_is_said_after_saving(
        self, admin_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        panel_router.down = True
        body = form(name="demo", ttl="60") | opened(admin_client, url(preset))
        response = admin_client.post(url(preset), body, follow=True)
        assert "The router did not take it yet (router unavailable)" in response.content.decode()
        assert Preset.objects.get().ttl == 60

    def test_clone_prefills_a_free_name_and_creates_a_copy(
        self, admin_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        text = admin_client.get(f"/presets/{preset.pk}/clone/").content.decode()
        assert 'value="demo-copy"' in text and 'value="temp"' in text
        response = admin_client.post(
            f"/presets/{preset.pk}/clone/", form(name="demo-copy", args=[("temp", "1")])
        )
        assert response.status_code == 302
        assert sorted(Preset.objects.values_list("name", flat=True)) == ["demo", "demo-copy"]

    def test_delete_asks_first_then_deletes_audits_and_reloads(
        self, admin_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        assert b"Delete demo?" in admin_client.get(f"/presets/{preset.pk}/delete/").content
        response = admin_client.post(f"/presets/{preset.pk}/delete/")
        assert response.status_code == 302 and response["Location"] == "/presets/"
        assert not Preset.objects.exists()
        assert AuditEvent.objects.get(kind=AuditKind.PRESET_DELETED).model == "demo"
        assert panel_router.of_kind("reload")

    def test_an_operator_pins_a_model_and_it_is_audited(
        self, operator_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        response = operator_client.post("/actions/model/", {"action": "pin", "model": "demo"})
        assert response.status_code == 302
        assert Preset.objects.get().pinned is True
        row = AuditEvent.objects.get(kind=AuditKind.PRESET_CHANGED)
        assert (row.actor, row.details["changes"]["pinned"]) == ("user:otto", [None, True])
        assert panel_router.of_kind("reload") == [{"actor": "user:otto"}]

    def test_unpinning_inherits_again_unless_the_global_section_pins(
        self, operator_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        for action in ("pin", "unpin"):
            operator_client.post("/actions/model/", {"action": action, "model": "demo"})
        assert Preset.objects.get().pinned is None  # as before the pin: it matches its INI
        settings_row = RouterSettings.load()
        settings_row.global_args = [["pinned", "true"]]
        settings_row.save()
        for action in ("pin", "unpin"):
            operator_client.post("/actions/model/", {"action": action, "model": "demo"})
        assert Preset.objects.get().pinned is False  # [*] pins: unpinning must say no


INI = """\
[*]
ctx-size = 4096

[alpha]
model = /models/alpha.gguf

[beta]
model = /models/beta.gguf
temp = 0.5
"""


class TestImportExport:
    def test_a_preview_lists_the_changes_and_changes_nothing(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        Preset.objects.create(name="alpha", model_path="/models/alpha.gguf")
        Preset.objects.create(name="beta", model_path="/models/old.gguf")
        response = admin_client.post(
            "/presets/import/", {"text": INI.replace("[beta]", "[gamma]"), "preview": "1"}
        )
        text = response.content.decode()
        assert response.status_code == 200
        assert "Preview: 1 created, 0 updated, 1 unchanged" in text
        assert "Apply these changes" in text
        assert sorted(Preset.objects.values_list("name", flat=True)) == ["alpha", "beta"]
        assert not AuditEvent.objects.exists() and not panel_router.of_kind("reload")

    def test_applying_imports_audits_and_reloads(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        Preset.objects.create(name="beta", model_path="/models/old.gguf")
        response = admin_client.post("/presets/import/", {"text": INI, "apply": "1"}, follow=True)
        assert "Imported: 1 created, 1 updated, 0 unchanged" in response.content.decode()
        assert Preset.objects.get(name="beta").model_path == "/models/beta.gguf"
        kinds = sorted(AuditEvent.objects.values_list("kind", "model"))
        assert ("preset_changed", "beta") in kinds and ("preset_created", "alpha") in kinds
        assert all(row.actor == "user:ada" for row in AuditEvent.objects.all())
        assert panel_router.of_kind("reload") == [{"actor": "user:ada"}]

    def test_an_uploaded_file_with_an_error_names_the_line_and_changes_nothing(
        self, admin_client: Client
    ) -> None:
        from django.core.files.uploadedfile import SimpleUploadedFile

        upload = SimpleUploadedFile("models.ini", b"[ok]\nctx-size = 1\n[broken\ntemp = 1\n")
        response = admin_client.post("/presets/import/", {"file": upload, "preview": "1"})
        text = response.content.decode()
        assert response.status_code == 200
        assert "The file has an error on line 3" in text
        assert '<li class="bad"><span>3</span>[broken</li>' in text
        assert not Preset.objects.exists()

    def test_an_empty_import_asks_for_a_file(self, admin_client: Client) -> None:
        response = admin_client.post("/presets/import/", {"text": "  ", "preview": "1"})
        assert response.status_code == 200
        assert "Choose a file or paste its text." in response.content.decode()

    def test_export_full_and_llama_compatible(self, viewer_client: Client) -> None:
        Preset.objects.create(name="plain", model_path="/m/plain.gguf", pinned=True)
        Preset.objects.create(name="own-bin", server_bin="python -m sim")
        full = viewer_client.get("/presets/export/")
        assert full["Content-Disposition"] == 'attachment; filename="presets.ini"'
        text = full.content.decode()
        assert "[plain]" in text and "pinned = true" in text and "[own-bin]" in text
        llama = viewer_client.get("/presets/export/?llama=1").content.decode()
        assert "[plain]" in llama and "pinned" not in llama and "[own-bin]" not in llama


class TestEffectiveValues:
    """A field the preset leaves empty shows what the router uses and where it comes from."""

    def test_the_list_and_detail_say_whether_a_value_is_own_from_star_or_the_default(
        self, viewer_client: Client, panel_router: RouterStub
    ) -> None:
        row = RouterSettings.load()
        row.global_args = [["stop-timeout", "12"], ["pinned", "true"]]
        row.default_stop_timeout = 10
        row.save()
        inherits = Preset.objects.create(name="inherits")
        Preset.objects.create(name="own", stop_timeout=20)
        listing = viewer_client.get("/presets/").content.decode()
        assert '12 s <small class="muted">from [*]</small>' in listing
        assert '20 s <small class="muted">set here</small>' in listing
        detail = viewer_client.get(f"/presets/{inherits.pk}/").content.decode()
        assert (
            '<dd id="effective-stop-timeout">12 s <small class="muted">from [*]</small></dd>'
            in detail
        )
        assert '<dt>Pinned</dt><dd>yes <small class="muted">from [*]</small></dd>' in detail
        assert '<dt>Idle TTL</dt><dd>off <small class="muted">default (Settings)</small>' in detail
        row.global_args = []
        row.save()
        detail = viewer_client.get(f"/presets/{inherits.pk}/").content.decode()
        assert '10 s <small class="muted">default (Settings)</small>' in detail

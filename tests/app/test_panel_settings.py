"""The settings page: admins get a validated form whose changes are audited and sent to the
router; everyone else reads the values."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from models_app.models import AuditEvent, AuditKind, Preset, RouterSettings
from models_app.panel import edits
from models_app.panel.views.admin_pages import _node_state
from tests.support.opened import versions
from tests.support.panel import RouterStub
from tests.support.settings_form import body

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


def test_a_change_is_validated_audited_and_sent_to_the_router(
    admin_client: Client, panel_router: RouterStub
) -> None:
    response = admin_client.post("/settings/", body(models_max="-1", settle_timeout="601"))
    text = response.content.decode()
    assert response.status_code == 200
    assert "Ensure this value is greater than or equal to 0." in text
    assert "At most 600 seconds." in text
    assert not AuditEvent.objects.exists() and not panel_router.of_kind("settings")

    response = admin_client.post(
        "/settings/", body(models_max="2", memory_budget="96G", max_wait="30"), follow=True
    )
    assert "Saved: Max running models, Memory budget, Max wait." in response.content.decode()
    row = RouterSettings.load()
    assert (row.models_max, row.memory_budget, row.max_wait) == (2, 96 << 30, 30)
    event = AuditEvent.objects.get(kind=AuditKind.SETTINGS_CHANGED)
    assert event.actor == "user:ada"
    assert event.details["changes"]["models_max"] == [4, 2]
    assert panel_router.of_kind("settings") == [{"actor": "user:ada"}]


def test_saving_unchanged_settings_writes_no_audit_row(
    admin_client: Client, panel_router: RouterStub
) -> None:
    response = admin_client.post("/settings/", body(), follow=True)
    assert "Nothing changed." in response.content.decode()
    assert not AuditEvent.objects.exists() and not panel_router.of_kind("settings")


def test_every_request_keeps_an_end_max_wait_cannot_be_emptied(
    admin_client: Client, panel_router: RouterStub
) -> None:
    assert RouterSettings.load().max_wait == 600  # the default: ten minutes
    response = admin_client.post("/settings/", body(max_wait=""))
    assert "This field is required." in response.content.decode()
    assert RouterSettings.load().max_wait == 600 and not panel_router.of_kind("settings")


def test_a_budget_too_small_for_a_preset_or_its_headroom_is_refused(
    admin_client: Client, panel_router: RouterStub
) -> None:
    Preset.objects.create(name="big", memory_estimate=40 << 30)
    response = admin_client.post("/settings/", body(memory_budget="32G", memory_headroom="40G"))
    text = response.content.decode()
    assert "big needs 40G plus the headroom: with this budget it could never load." in text
    assert "The headroom must be smaller than the budget." in text
    assert RouterSettings.load().memory_budget is None


def test_fewer_slots_than_load_on_startup_presets_is_refused(
    admin_client: Client, panel_router: RouterStub
) -> None:
    for name in ("a", "b"):
        Preset.objects.create(name=name, load_on_startup=True)
    response = admin_client.post("/settings/", body(models_max="1"))
    assert "2 presets load on startup" in response.content.decode()


def test_a_size_must_be_readable(admin_client: Client, panel_router: RouterStub) -> None:
    response = admin_client.post("/settings/", body(memory_budget="lots"))
    assert "Write a size such as 8G" in response.content.decode()


@pytest.mark.parametrize("who", ["viewer_client", "operator_client"])
def test_others_read_the_values_but_get_no_form(
    who: str, request: pytest.FixtureRequest, panel_router: RouterStub
) -> None:
    client: Client = request.getfixturevalue(who)
    response = client.get("/settings/")
    text = response.content.decode()
    assert response.status_code == 200
    assert 'id="settings-readonly"' in text and "<dt>Max running models</dt>" in text
    assert '<form method="post" class="card"' not in text and 'name="models_max"' not in text
    assert client.post("/settings/", body(models_max="1")).status_code == 403
    assert RouterSettings.load().models_max == 4


def test_a_command_line_override_is_pointed_out(
    admin_client: Client, panel_router: RouterStub
) -> None:
    text = admin_client.get("/settings/").content.decode()  # the stub runs with models_max 2
    assert "The router runs with max 2 models" in text


def test_the_queue_policy_is_a_setting_that_reaches_the_router_config(
    admin_client: Client, panel_router: RouterStub
) -> None:
    """Issue 17.5: fifo by default; the form takes fair (and nothing else), the change is
    audited and sent to the router, and the config the router is built with carries it unless
    ``--queue-policy`` overrides it."""
    from models_app.presets.specs import Overrides, router_config

    assert RouterSettings.load().queue_policy == "fifo"
    page = admin_client.get("/settings/").content.decode()
    assert 'name="queue_policy"' in page and 'value="fair"' in page
    refused = admin_client.post("/settings/", body(queue_policy="lottery"))
    assert "Select a valid choice." in refused.content.decode()
    response = admin_client.post("/settings/", body(queue_policy="fair"), follow=True)
    assert "Saved: Queue policy." in response.content.decode()
    event = AuditEvent.objects.get(kind=AuditKind.SETTINGS_CHANGED)
    assert event.details["changes"]["queue_policy"] == ["fifo", "fair"]
    assert panel_router.of_kind("settings") == [{"actor": "user:ada"}]
    row = RouterSettings.load()
    assert router_config(row).queue_policy == "fair"
    assert router_config(row, Overrides(queue_policy="fifo")).queue_policy == "fifo"


def test_queue_policy_flag_and_variable_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from models_app import runtime
    from routerpanel.env import EnvError

    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        runtime.add_router_arguments(parser)
        return parser.parse_args(list(argv))

    monkeypatch.delenv("ROUTERPANEL_QUEUE_POLICY", raising=False)
    assert parse().queue_policy is None  # the stored setting applies
    assert parse("--queue-policy", "fair").queue_policy == "fair"
    monkeypatch.setenv("ROUTERPANEL_QUEUE_POLICY", "fair")
    assert parse().queue_policy == "fair"
    monkeypatch.setenv("ROUTERPANEL_QUEUE_POLICY", "lottery")
    with pytest.raises(EnvError, match="ROUTERPANEL_QUEUE_POLICY"):
        parse()


class TestNodeSettings:
    """Several hosts (issue 18): a node's own capacity over the router settings."""

    def post(self, client: Client, node: str, **values: Any) -> Any:
        fields = {"node": node, "models_max": "", "memory_budget": "", "settle_timeout": ""}
        data = {f"node-{node}-{k}": v for k, v in (fields | values).items()}
        page = versions(client, "/settings/")  # a node with no row nor state is not shown:
        name = f"node-{node}-seen_version"  # its form would carry the version of no row
        data[name] = page.get(name, edits.fingerprint(_node_state(None)))
        return client.post(f"/settings/nodes/{node}/", data, follow=True)

    def test_a_nodes_max_is_saved_audited_and_sent_to_that_node_only(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        from models_app.models import NodeSettings
        from models_app.presets.specs import Overrides, router_config

        text = self.post(admin_client, "studio-2", models_max="1", memory_budget="64G")
        assert "Saved the settings of node studio-2" in text.content.decode()
        own = NodeSettings.objects.get(node="studio-2")
        assert (own.models_max, own.memory_budget, own.settle_timeout) == (1, 64 << 30, None)
        row = AuditEvent.objects.get(kind=AuditKind.SETTINGS_CHANGED)
        assert row.node == "studio-2" and row.reason.startswith("node studio-2: ")
        assert panel_router.of_kind("settings") == [{"actor": "user:ada", "node": "studio-2"}]
        settings_row = RouterSettings.load()
        config = router_config(settings_row, Overrides(node="studio-2"), own)
        assert (config.models_max, config.memory_budget) == (1, 64 << 30)
        assert config.settle_timeout == settings_row.settle_timeout  # not its own: the default
        assert router_config(settings_row, Overrides(models_max=3), own).models_max == 3  # flag
        page = admin_client.get("/settings/").content.decode()
        assert 'id="node-settings"' in page and "from this node's settings" in page

    def test_empty_values_give_the_node_the_router_settings_again(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        from models_app.models import NodeSettings

        self.post(admin_client, "studio-2", models_max="1")
        self.post(admin_client, "studio-2")
        assert not NodeSettings.objects.exists()
        assert AuditEvent.objects.filter(kind=AuditKind.SETTINGS_CHANGED).count() == 2

    def test_a_bad_value_names_the_field_and_changes_nothing(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        from models_app.models import NodeSettings

        text = self.post(admin_client, "studio-2", settle_timeout="601").content.decode()
        assert "Node studio-2: settle_timeout: At most 600 seconds." in text
        assert not NodeSettings.objects.exists() and not panel_router.of_kind("settings")

    def test_viewers_may_not_change_a_node(
        self, viewer_client: Client, panel_router: RouterStub
    ) -> None:
        response = viewer_client.post("/settings/nodes/studio-2/", {})
        assert response.status_code == 403

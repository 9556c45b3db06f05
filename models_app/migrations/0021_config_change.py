"""The change counter every router watches (models.ConfigChange, config_watch.py).

Triggers raise it on any INSERT, UPDATE or DELETE of presets, router settings and node
settings, from any client, so that a change made outside the panel (import_presets, the Django
admin, a script, plain SQL) reaches every router. The statement inserts the row the first time.
"""

from django.db import migrations, models

TABLES = ("models_app_preset", "models_app_routersettings", "models_app_nodesettings")
BUMP = (
    "INSERT INTO models_app_configchange (id, version) VALUES (1, 1) "
    "ON CONFLICT (id) DO UPDATE SET version = models_app_configchange.version + 1"
)


def sqlite(table: str, event: str) -> tuple[str, str]:
    name = f"rp_config_{table}_{event.lower()}"
    create = f"CREATE TRIGGER {name} AFTER {event} ON {table} BEGIN {BUMP}; END"
    return create, f"DROP TRIGGER IF EXISTS {name}"


def postgresql(table: str) -> tuple[str, str]:
    name = f"rp_config_{table}"
    create = (
        f"CREATE TRIGGER {name} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION rp_config_changed()"
    )
    return create, f"DROP TRIGGER IF EXISTS {name} ON {table}"


FUNCTION = (
    "CREATE OR REPLACE FUNCTION rp_config_changed() RETURNS trigger AS $$ "
    f"BEGIN {BUMP}; RETURN NULL; END $$ LANGUAGE plpgsql"
)


def statements(vendor: str) -> list[tuple[str, str]]:
    if vendor == "postgresql":
        return [(FUNCTION, "DROP FUNCTION IF EXISTS rp_config_changed()")] + [
            postgresql(t) for t in TABLES
        ]
    if vendor == "sqlite":
        return [sqlite(t, e) for t in TABLES for e in ("INSERT", "UPDATE", "DELETE")]
    raise NotImplementedError(f"no change triggers for the {vendor} database")


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    for sql, _ in statements(schema_editor.connection.vendor):
        schema_editor.execute(sql)


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    for _, sql in reversed(statements(schema_editor.connection.vendor)):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("models_app", "0020_max_wait_default"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConfigChange",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("version", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(create, drop),
    ]

"""Django settings for RouterPanel, read from the environment (DESIGN §2, STYLE 11).

Every variable is listed with its default in ``.env.example``. Values that do not parse stop the
process at import time; values that parse but are wrong are reported by the system checks in
``models_app.checks`` (ids ``routerpanel.E0xx`` / ``routerpanel.W0xx``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from celery.schedules import crontab

from routerpanel.env import envbool, envchoice, envint, envlist, envpath, envstr, secret_key_from
from routerpanel.router.config import DEFAULT_STOP_TIMEOUT

BASE_DIR = Path(__file__).resolve().parent.parent

# The data dir holds the embedded SQLite database, the generated secret key, the router's state
# file and the audit spool. `serve --data-dir` sets ROUTERPANEL_DATA_DIR before Django starts.
DATA_DIR = envpath("ROUTERPANEL_DATA_DIR", BASE_DIR / "var")
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = secret_key_from(DATA_DIR)
DEBUG = envbool("DEBUG", False)
# The host names the panel answers to (a request for any other gets 400, see
# docs/team-deployment.md), and the origins besides its own whose pages may post its forms and
# open its WebSocket (an HTTPS proxy in front: https://panel.example.org).
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
# Browser origins besides the server's own whose pages may call the API routes that change
# state (/models/load, /models/unload, /models/cancel, ...). Inference routes allow every origin.
CORS_ALLOWED_ORIGINS = envlist("CORS_ALLOWED_ORIGINS", [])

# Behind an HTTPS reverse proxy that sets X-Forwarded-Proto (and strips it from clients): the
# requests count as secure, cookies are sent over HTTPS only, and HSTS may be switched on.
BEHIND_HTTPS = envbool("ROUTERPANEL_BEHIND_HTTPS", False)
if BEHIND_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = envint("ROUTERPANEL_HSTS_SECONDS", 0, minimum=0)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_celery_beat",  # scheduled preloads and the periodic jobs, edited in the admin
    "axes",  # before models_app: its sign-in receivers run before ours (models_app.accounts.signin)
    "models_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # turns a locked-out sign-in into the lockout page
    "models_app.disk.StorageErrorMiddleware",  # a full disk: a page that says so, not a bare 500
]

ROOT_URLCONF = "routerpanel.urls"
ASGI_APPLICATION = "routerpanel.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "models_app.panel.views.common.panel",
            ],
        },
    },
]

# DATABASE_URL selects PostgreSQL for team mode; without it the embedded SQLite file lives in
# the data dir.
DATABASE_URL = envstr("DATABASE_URL")
if DATABASE_URL:
    DATABASES: dict[str, dict[str, Any]] = {
        "default": dict(dj_database_url.parse(DATABASE_URL, conn_max_age=60))
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "routerpanel.sqlite3",
            # Several threads write (the audit writer, the panel, the socket's actions). In WAL
            # mode readers never wait for a writer; IMMEDIATE transactions take the write lock
            # when they begin, so two writers queue for up to ``timeout`` instead of one failing
            # at once with "database is locked" (a read-then-write upgrade cannot wait).
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL;",
            },
            # Tests get a file too, not SQLite's in-memory database: its shared cache answers a
            # second writer at once with "database table is locked" (no busy timeout applies),
            # so tests would see failures production never has, and not the locking it does have.
            "TEST": {"NAME": str(DATA_DIR / "test.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# REDIS_URL switches on team mode plumbing: the Redis channel layer and the Celery broker.
# Without it the channel layer is in-memory and Celery runs tasks inline (embedded mode).
REDIS_URL = envstr("REDIS_URL")
# Every Redis key of this installation starts with it (channels, the router's lock and
# heartbeat): two installations, or a test run, can share one Redis server without meeting.
ROUTERPANEL_REDIS_PREFIX = envstr("ROUTERPANEL_REDIS_PREFIX", "routerpanel")
# Team mode's data path (acquire/renew/release/cancel): one socket per web process to its
# router (models_app/routing/link.py). false: runrouter does not listen and web processes use the
# channel layer for these too.
ROUTERPANEL_ROUTER_LINK = envbool("ROUTERPANEL_ROUTER_LINK", True)
# Web side: auto uses the router's Unix socket when it runs on this host, else its TCP address;
# tcp always uses TCP (a container without the router's data volume).
ROUTERPANEL_ROUTER_LINK_VIA = envchoice("ROUTERPANEL_ROUTER_LINK_VIA", ("auto", "tcp"), "auto")
# Router side (runrouter --link-port): the TCP port of the data path; unset: any free port, and
# only when --advertise is not loopback.
ROUTERPANEL_LINK_PORT = envint("ROUTERPANEL_LINK_PORT", None, minimum=0)
# Several hosts (issue 18; runrouter's --node, --advertise, --child-keys default to these).
ROUTERPANEL_NODE = envstr("ROUTERPANEL_NODE")
ROUTERPANEL_ADVERTISE = envstr("ROUTERPANEL_ADVERTISE", "127.0.0.1")
ROUTERPANEL_CHILD_KEYS = envstr("ROUTERPANEL_CHILD_KEYS", "auto")
# A burst must overflow neither a router's channel ("router", or "router.<node>" with several
# hosts) nor a web process's reply channels (all of one process's replies share one Redis key):
# a lost reply is seconds of waiting (routing/layer.py, QUEUED_RECHECK). Messages carry their
# deadlines.
# Channels reads each key as a glob matched whole: "router" alone left "router.studio-1" at the
# default capacity (1,000).
CHANNEL_CAPACITY = {"router": 100_000, "router.*": 100_000, "specific.*": 100_000}
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's core layer whose receive() outlives Redis outages.
            "BACKEND": "models_app.routing.layers.ResilientRedisLayer",
            "CONFIG": {
                # redis-py 8 times reads out after 5 s by default, exactly channels_redis's
                # blocking-pop timeout: an idle router would die of "Timeout reading". Give the
                # socket room above the 5 s pop; connecting fails fast while Redis is down.
                "hosts": [
                    {"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 2}
                ],
                "prefix": f"{ROUTERPANEL_REDIS_PREFIX}:asgi:",
                "capacity": 1000,
                "channel_capacity": CHANNEL_CAPACITY,
                "expiry": 30,
            },
        }
    }
else:
    # Channels' in-memory layer that drops what a closed socket leaves (models_app/layers.py).
    CHANNEL_LAYERS = {"default": {"BACKEND": "models_app.routing.layers.InMemoryLayer"}}

# Embedded mode never talks to a broker (tasks run inline); the in-memory URL names a host only
# so that kombu does not warn "No hostname was supplied" on every start.
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TIMEZONE = envstr("TIME_ZONE", "UTC")
# The periodic jobs (models_app.tasks). `celery beat` with django-celery-beat's DatabaseScheduler
# copies them into its tables, where admins also add scheduled preloads.
# Reservations (issue 17.6): how often the schedule hands the router the bookings open now.
RESERVATIONS_TICK_SECONDS = float(envint("ROUTERPANEL_RESERVATIONS_TICK_SECONDS", 30, minimum=1))
CELERY_BEAT_SCHEDULE = {
    "audit-retention": {
        "task": "models_app.tasks.retention_task",
        "schedule": crontab(hour=3, minute=30),
    },
    "memory-rollup": {"task": "models_app.tasks.memory_rollup_task", "schedule": 60.0},
    "reservations": {
        "task": "models_app.tasks.reservations_tick",
        "schedule": RESERVATIONS_TICK_SECONDS,
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Sign-in throttling (django-axes): after ROUTERPANEL_LOGIN_FAILURE_LIMIT failures for one user
# name, or from one client address, within the lockout time, sign-ins for it are refused until
# the lockout time has passed since the last failure, or an admin unlocks it (Users page).
# Behind a reverse proxy every client has the proxy's address: set
# ROUTERPANEL_LOGIN_LOCK_BY_ADDRESS=false there, or one person's typos lock out everyone.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = envint("ROUTERPANEL_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=envint("ROUTERPANEL_LOGIN_LOCKOUT_SECONDS", 900, minimum=1))
LOCK_BY_ADDRESS = envbool("ROUTERPANEL_LOGIN_LOCK_BY_ADDRESS", True)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"] if LOCK_BY_ADDRESS else ["username"]
# Attempts during a lockout do not extend it: it ends a lockout time after the last failure.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "models_app.panel.views.signin.locked_out"
AXES_DISABLE_ACCESS_LOG = True  # successful sign-ins: Django's last_login is enough

# The panel's own sign-in page; after signing in (or out) people land on the dashboard.
LOGIN_URL = "panel:login"
LOGIN_REDIRECT_URL = "panel:dashboard"
LOGOUT_REDIRECT_URL = "panel:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = envstr("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
# Serve static files straight from the app and project folders: one process, no collectstatic.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Router defaults. The stored RouterSettings row wins once it exists; `serve` flags win over both.
ROUTERPANEL = {
    "MODELS_MAX": envint("ROUTERPANEL_MODELS_MAX", 4, minimum=0),
    "DEFAULT_STOP_TIMEOUT": envint("ROUTERPANEL_STOP_TIMEOUT", DEFAULT_STOP_TIMEOUT, minimum=0),
    "SERVER_BIN": envstr("ROUTERPANEL_SERVER_BIN", "llama-server"),
    "ADMIN_PASSWORD": envstr("ROUTERPANEL_ADMIN_PASSWORD"),
    # Seconds a request may take to arrive whole, headers and body, before it is answered 408.
    "BODY_TIMEOUT": envint("ROUTERPANEL_BODY_TIMEOUT", 30, minimum=1),
    # Seconds of silence after which /models/sse sends a ": keep-alive" comment line.
    "SSE_KEEPALIVE": envint("ROUTERPANEL_SSE_KEEPALIVE", 15, minimum=1),
    # Free space in the data dir under which /ready and the log warn (megabytes).
    "DISK_WARN_MB": envint("ROUTERPANEL_DISK_WARN_MB", 1024, minimum=0),
    # Dashboard sockets (panel tabs) one user may have open at once; 0: no cap.
    "MAX_SOCKETS_PER_USER": envint("ROUTERPANEL_MAX_SOCKETS_PER_USER", 8, minimum=0),
}

LOG_LEVEL = envstr("LOG_LEVEL", "INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # A user's first screen is the URL and the password: at the default level, no line per task
    # run inline (embedded mode; a team-mode worker logs its tasks itself) and none of Daphne's
    # start-up chatter (serve prints the URL once the socket listens). LOG_LEVEL=DEBUG shows all.
    "loggers": {
        name: {"level": "WARNING" if LOG_LEVEL == "INFO" else LOG_LEVEL}
        for name in ("daphne.server", "axes.apps")
        + (() if REDIS_URL else ("celery.app.trace",))  # a team-mode worker says what it ran
    },
}

"""Django settings for the Rookery console.

Every setting an operator may need comes from the environment, with a default
that works from a fresh checkout (SQLite and runtime state under ``var/``).

Environment (see ``deploy/README.md`` and ``deploy/console.env.example``):

=====================  ==========================================================
``SECRET_KEY``         Django's signing key. Unset: one is generated on first start
                       and kept in ``DATA_DIR/secret_key`` (mode 0600). Set it when
                       several hosts serve the same console.
``DEBUG``              ``1`` for development (tracebacks, static files served by
                       ``runserver``). Default ``0``. With ``DEBUG`` on the console
                       answers loopback clients only: a request from any other
                       address, or carrying a proxy's ``X-Forwarded-For``,
                       ``X-Real-IP`` or ``Forwarded`` header, gets a plain 403, so
                       no debug page reaches another machine (``console/loopback.py``).
``MAX_REQUEST_BODY_BYTES`` the largest request body accepted, forms and JSON alike
                       (also Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``); larger is
                       refused with a 400 before it is read. Default 1048576 (1 MiB).
``MAX_QUERY_STRING_BYTES`` the longest query string accepted; longer, or with more
                       than 1000 fields, is a 400 before it is parsed. Default 8192.
                       (Daphne answers a request line or header over 16 KB with
                       414/431, all headers over 16 KB with 400.)
``MAX_JSON_DEPTH``     how deeply a JSON body (API) or document (configuration
                       editor) may nest arrays and objects; deeper is refused with a
                       400 before parsing. Default 32 (a configuration request
                       nests 5).
``ALLOWED_HOSTS``      comma-separated host names; default ``127.0.0.1,localhost``.
``CSRF_TRUSTED_ORIGINS`` comma-separated origins (``https://console.example.com``)
                       allowed to POST when they differ from the request's own host.
``CONSOLE_HTTPS``      the console is served over HTTPS (behind the nginx of
                       ``deploy/nginx``): secure cookies, trust ``X-Forwarded-Proto``.
                       Default: on unless ``DEBUG``.
``DATABASE_URL``       ``sqlite:///var/console.sqlite3`` (relative to the checkout;
                       four slashes for an absolute path) or
                       ``postgres://user:password@host:port/dbname``.
                       Default: ``DATA_DIR/console.sqlite3``.
``REDIS_URL``          Channels layer and Celery broker; default
                       ``redis://127.0.0.1:6379/0``.
``CONSOLE_BROKER_TOKEN`` the token brokers present on the broker link; empty:
                       no broker is accepted.
``COMMAND_TIMEOUT_SECONDS`` how long a command to a broker is retried before it
                       times out; default 60.
``COMMAND_RETRY_SECONDS`` seconds between deliveries of an unacknowledged command;
                       default 2.
``BROKER_STALE_INTERVALS`` a broker silent for this many heartbeat intervals is
                       marked down (alarm ``broker.down``); default 3.
``STALE_CHECK_SECONDS``  how often Celery beat looks for silent brokers and
                       overdue commands; default 2.
``BROKER_RECONNECT_GRACE`` seconds a broker last heard before the console (re)started
                       gets to link again before its silence counts; default 6.
                       While no console process beats, no broker is judged at all
                       (``clusterapi/presence.py``).
``CONSOLE_BEAT``       the console process records its beat for stale detection;
                       default 1 (0 only for tests that run the ASGI app in-process).
``CHANNEL_GROUP_EXPIRY`` seconds after which a live page's channel leaves its group
                       unless it re-joined (every third of it): what a stopped
                       console process left behind is gone by then; default 180.
``HEARTBEAT_RETENTION`` hours of heartbeat and queue samples kept; default 48.
``QUEUE_SAMPLE_SECONDS`` at most one per-queue sample per queue in this many
                       seconds (queue snapshots are updated every status anyway);
                       default 5.
``SPARK_MASTER``       where the pipeline's Spark jobs run; default ``local[*]``.
``ARCHIVE_AFTER``      minutes after which heartbeat and queue samples move from
                       the database into the Parquet lake; default 60.
``ARCHIVE_BATCH_ROWS`` samples per archive batch (one file per date and broker);
                       default 50000.
``LAKE_PATH``          the lake's root directory; default ``DATA_DIR/lake``. For a
                       Spark cluster, a directory every executor can read.
``REPORTS_DIR``        where report runs write (one directory per run); default
                       ``DATA_DIR/reports``.
``REPORT_TIMEOUT_SECONDS`` a report job still running after this is stopped and
                       the run failed; default 3600.
``REPORT_NIGHTLY_AT``  ``HH:MM`` (UTC) of the nightly archive + report of the
                       previous day; ``off`` disables it. Default ``00:30``.
``DATA_DIR``           runtime state (database, secret key, static files, reports);
                       default ``var/`` in the checkout; relative paths are taken
                       from the checkout.
``AXES_FAILURE_LIMIT`` failed logins (dashboard or API token) of one user from
                       one address before that pair is locked out (429); default 5.
``AXES_COOLOFF_MINUTES`` how long such a lockout lasts; default 15.
``LOG_LEVEL``          default ``INFO``. One access line per request.
=====================  ==========================================================
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from console.environment import (
    SettingError,
    ensure_sqlite_directory,
    env_bool,
    env_int,
    env_list,
    env_str,
    load_or_create_secret_key,
    parse_database_url,
    resolve_path,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# -- runtime state and secrets ----------------------------------------------------------

DATA_DIR = resolve_path(env_str("DATA_DIR", "var"), BASE_DIR)

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY", "") or load_or_create_secret_key(DATA_DIR / "secret_key")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

# -- applications -------------------------------------------------------------------------

INSTALLED_APPS = [
    "daphne",  # first: its runserver replaces Django's and serves the ASGI app
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files for /api/v1/docs/, no CDN
    "axes",  # login rate limit: after the other apps, as django-axes asks
    "clusterapi",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # before anything that can fail or read a body: DEBUG answers loopback clients only,
    # and bodies are bounded before CSRF or a view parses them (DESIGN.md section 10)
    "console.loopback.LoopbackOnlyDebugMiddleware",
    "console.bodylimits.BodyLimitsMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # last, as django-axes asks: turns a locked-out login into its 429 answer
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

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
            ],
        },
    },
]

# -- database -----------------------------------------------------------------------------

DATABASES = {
    "default": parse_database_url(
        env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'console.sqlite3'}"), BASE_DIR
    )
}
ensure_sqlite_directory(DATABASES["default"])

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- Redis: Channels layer and Celery -------------------------------------------------

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

# channels_redis waits for messages with a 5 s blocking pop, and redis-py's default
# socket timeout is also 5 s: a busy event loop then reads the pop's answer after the
# socket timed out and the consumer dies. The timeout is a safety net, not a deadline.
CHANNEL_LAYER_SOCKET_TIMEOUT = 30

CHANNEL_GROUP_EXPIRY = env_int("CHANNEL_GROUP_EXPIRY", 180)
GROUP_REFRESH_SECONDS = max(1, CHANNEL_GROUP_EXPIRY // 3)
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT}],
            "prefix": "rookery:asgi",
            # a console process that dies leaves its pages' channels in the dashboard
            # group: they drop out after this, as live consumers re-join every
            # GROUP_REFRESH_SECONDS (console.dashboard.live, clusterapi.consumers)
            "group_expiry": CHANNEL_GROUP_EXPIRY,
        },
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

# -- Rookery ------------------------------------------------------------------------------

CONSOLE_BROKER_TOKEN = env_str("CONSOLE_BROKER_TOKEN", "")
COMMAND_TIMEOUT_SECONDS = env_int("COMMAND_TIMEOUT_SECONDS", 60)
COMMAND_RETRY_SECONDS = env_int("COMMAND_RETRY_SECONDS", 2)
BROKER_STALE_INTERVALS = env_int("BROKER_STALE_INTERVALS", 3)
STALE_CHECK_SECONDS = env_int("STALE_CHECK_SECONDS", 2)
# seconds a broker last heard before the console (re)started gets to link again before
# its heartbeat allowance starts: brokerd retries a console that is not there at most
# every 2.5 s (brokerd.consolelink.link), then needs a handshake and a hello
BROKER_RECONNECT_GRACE = env_int("BROKER_RECONNECT_GRACE", 6)
# the console process beats (clusterapi.presence); off only in tests that call the
# ASGI application in-process
CONSOLE_BEAT = env_bool("CONSOLE_BEAT", True)
HEARTBEAT_RETENTION = env_int("HEARTBEAT_RETENTION", 48)  # hours
QUEUE_SAMPLE_SECONDS = env_int("QUEUE_SAMPLE_SECONDS", 5)
SPARK_MASTER = env_str("SPARK_MASTER", "local[*]")
ARCHIVE_AFTER = env_int("ARCHIVE_AFTER", 60)  # minutes
ARCHIVE_BATCH_ROWS = env_int("ARCHIVE_BATCH_ROWS", 50_000)
LAKE_PATH = resolve_path(env_str("LAKE_PATH", str(DATA_DIR / "lake")), BASE_DIR)
REPORTS_DIR = resolve_path(env_str("REPORTS_DIR", str(DATA_DIR / "reports")), BASE_DIR)
REPORT_TIMEOUT_SECONDS = env_int("REPORT_TIMEOUT_SECONDS", 3600)
REPORT_NIGHTLY_AT = env_str("REPORT_NIGHTLY_AT", "00:30")  # UTC; "off": no nightly report

# -- authentication -----------------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# django-axes counts failed logins (the dashboard's and the API token's) per user and
# address: after AXES_FAILURE_LIMIT of them, that pair is refused (429) for
# AXES_COOLOFF_MINUTES; a successful login resets the count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = dt.timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "console.views.locked_out"
AXES_VERBOSE = False

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# -- cookies and transport security -------------------------------------------------------

CONSOLE_HTTPS = env_bool("CONSOLE_HTTPS", not DEBUG)

SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600)  # an operator's shift
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = CONSOLE_HTTPS
CSRF_COOKIE_SAMESITE = "Lax"
CSRF_FAILURE_VIEW = "clusterapi.api.errors.csrf_failure"
CSRF_COOKIE_SECURE = CONSOLE_HTTPS
if CONSOLE_HTTPS:
    # TLS ends at the reverse proxy (deploy/nginx/rookery.conf), which sets this header;
    # Daphne itself listens on loopback only.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# -- request limits (console/bodylimits.py) -----------------------------------------------

MAX_REQUEST_BODY_BYTES = env_int("MAX_REQUEST_BODY_BYTES", 1024 * 1024)
MAX_JSON_DEPTH = env_int("MAX_JSON_DEPTH", 32)
if MAX_REQUEST_BODY_BYTES < 1 or MAX_JSON_DEPTH < 1:
    raise SettingError("MAX_REQUEST_BODY_BYTES and MAX_JSON_DEPTH must be at least 1")
# Django's own check when a form body is read, and for bodies without a length
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BODY_BYTES
# a query string is refused (400) past this many bytes, or past
# DATA_UPLOAD_MAX_NUMBER_FIELDS (Django's 1000) fields, before it is parsed
# (console/querylimits.py); the dashboard's filters need a few hundred bytes
MAX_QUERY_STRING_BYTES = env_int("MAX_QUERY_STRING_BYTES", 8192)

# -- REST API -----------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's defaults with its JSON parser replaced (clusterapi/api/parsers.py)
    "DEFAULT_PARSER_CLASSES": [
        "clusterapi.api.parsers.SafeJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "clusterapi.api.schema.ApiSchema",
    "EXCEPTION_HANDLER": "clusterapi.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Rookery admin API",
    # Markdown (Swagger UI): a bare <...> is an HTML tag and vanishes, so code spans
    "DESCRIPTION": "Brokers, cluster state and configuration of a Rookery cluster. "
    "Authenticate with `POST /api/v1/auth/token/` and send the header "
    "`Authorization: Token <your-token>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "ENUM_NAME_OVERRIDES": {"ReportRunStateEnum": "clusterapi.models.ReportRun.STATE_CHOICES"},
    # request bodies are their own components, so that they can refuse unknown properties
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "clusterapi.api.schema.strict_request_bodies",
    ],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# -- internationalisation, static files ---------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# htmx, htmx-ext-ws and uPlot: served from node_modules (npm ci in `make setup`) as
# static/vendor/<name>; the names are listed in console/vendor_static.py.
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "console.vendor_static.NodeModulesFinder",
]
STATIC_ROOT = DATA_DIR / "static"

# -- logging: one line per event on stderr, like brokerd ----------------------------------

LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "line": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "line"},
    },
    "root": {"handlers": ["stderr"], "level": LOG_LEVEL},
    # One access line per request, written by the server (Daphne's access log, or
    # django.channels.server under `runserver`). Django's own loggers would add copies:
    # its DEBUG console handler, django.server's handler, and django.request's warning
    # for every 4xx. They keep no handler of their own (their records reach the root
    # once), and django.request reports only server errors (5xx, with the traceback).
    "loggers": {
        "django": {"handlers": [], "level": LOG_LEVEL, "propagate": True},
        "django.server": {"handlers": [], "level": LOG_LEVEL, "propagate": True},
        "django.channels.server": {"handlers": [], "level": LOG_LEVEL, "propagate": True},
        "django.request": {"handlers": [], "level": "ERROR", "propagate": True},
        # "N of M channels over capacity in group dashboard", at INFO on every send,
        # for the channels of pages a stopped console process left behind until they
        # expire (CHANNEL_GROUP_EXPIRY): expected after a restart, not news
        "channels_redis": {"handlers": [], "level": "WARNING", "propagate": True},
    },
}

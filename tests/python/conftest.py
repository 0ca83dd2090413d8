"""Connections for the Python failure-point tests (scripts/lang_tests.sh sets them up).

The cluster, the database and the roles come from the environment: libpq's own PGHOST, PGPORT
and PGDATABASE, and the three login roles the script creates, each an ordinary role (not a
superuser) granted one of pg_intent's roles:

  PG_INTENT_APP_ROLE       member of intent_app: every protocol call of these tests
  PG_INTENT_OPERATOR_ROLE  member of intent_operator: abandon_attempt, and reading the tables
  PG_INTENT_ADMIN_ROLE     member of intent_admin: define_contract
"""

import os

import psycopg
import pytest

ROLES = {
    "app": os.environ.get("PG_INTENT_APP_ROLE", "intent_lang_app"),
    "operator": os.environ.get("PG_INTENT_OPERATOR_ROLE", "intent_lang_operator"),
    "admin": os.environ.get("PG_INTENT_ADMIN_ROLE", "intent_lang_admin"),
}


@pytest.fixture(scope="session", autouse=True)
def _cluster_is_configured():
    if not os.environ.get("PGHOST") or not os.environ.get("PGPORT"):
        pytest.exit("PGHOST and PGPORT are not set: run bash scripts/lang_tests.sh", returncode=2)


@pytest.fixture
def connect():
    """connect(kind, application_name) -> a new autocommit connection as that role; all are
    closed when the test ends."""
    opened = []

    def open_one(kind="app", application_name="pg_intent_python"):
        conn = psycopg.connect(
            user=ROLES[kind], application_name=application_name, autocommit=True, connect_timeout=10
        )
        # No test may hang the suite: a call stuck on a lock fails instead.
        conn.execute("SET statement_timeout = '60s'")
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.close()


@pytest.fixture
def app(connect):
    return connect("app")


@pytest.fixture
def operator(connect):
    return connect("operator")


@pytest.fixture(scope="session")
def contract():
    """The contract some fingerprints name, defined (idempotently) by the admin role."""
    with psycopg.connect(user=ROLES["admin"], autocommit=True) as conn:
        conn.execute("SELECT intent.define_contract('image-v1', '{}'::jsonb)")
    return "image-v1"

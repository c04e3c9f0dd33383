"""Secret references in task definitions: parsed and validated at create/update, resolved by the
worker, never printed (issue 17)."""

from __future__ import annotations

import io
import logging
import pickle
from pathlib import Path

import orjson
import pytest

from sluice.ops.logging_setup import Redactor
from sluice.security.secrets import (
    Secret,
    SecretError,
    SecretRef,
    SecretRefError,
    parse_ref,
    resolve,
    reveal,
    revealed,
    url_has_password,
)
from sluice.service.errors import InvalidError
from sluice.service.tasks import parse_definition, parse_definition_text, redacted_definition
from sluice.sync.tasks import TaskSpec, TaskSpecError, parse_spec, resolved, scrub

FIELD = "task.source.password"
DEFINITION = {
    "id": "shop",
    "source": {
        "kind": "mariadb",
        "user": "sync",
        "password": {"env": "SHOP_DB_PASSWORD"},
        "database": "shop",
    },
    "tables": ["orders"],
    "target": {"url": "postgresql://sync@db:5432/shop", "password": {"file": "/run/secrets/shop-pg"}},
}


def test_references_parse_and_print_as_themselves() -> None:
    env = parse_ref({"env": "SHOP_DB_PASSWORD"}, FIELD)
    assert env == SecretRef("env", "SHOP_DB_PASSWORD") and str(env) == "{env: SHOP_DB_PASSWORD}"
    path = parse_ref({"file": "/run/secrets/shop"}, FIELD)
    assert path is not None and path.stored() == {"file": "/run/secrets/shop"} == path.shown()
    assert parse_ref(None, FIELD) is None and parse_ref("", FIELD) is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("opensesame", "plain-text secret is refused"),
        ("***", "*** is how a password stored in plain text is shown"),
        ({"env": "1BAD NAME"}, "must be an environment variable name"),
        ({"file": "relative/path"}, "must be an absolute path"),
        ({"vault": "x"}, "must be a secret reference"),
        ({"env": "A", "file": "/b"}, "must be a secret reference"),
        (42, "must be a secret reference"),
    ],
)
def test_a_plain_or_malformed_secret_is_refused_saying_how_to_write_it(value: object, says: str) -> None:
    with pytest.raises(SecretRefError) as raised:
        parse_ref(value, FIELD)
    assert raised.value.field == FIELD and says in str(raised.value)
    assert "opensesame" not in str(raised.value)
    if "refused" in says or "shown" in says:
        assert "`password: {env: SHOP_DB_PASSWORD}`" in str(raised.value)
        assert "`password: {file: /run/secrets/shop}`" in str(raised.value)


def test_definitions_with_plain_text_secrets_are_refused_naming_the_field() -> None:
    plain_source = {**DEFINITION, "source": {**DEFINITION["source"], "password": "opensesame"}}
    plain_url = {**DEFINITION, "target": "postgresql://sync:opensesame@db:5432/shop"}
    plain_query = {**DEFINITION, "target": "postgresql://sync@db:5432/shop?password=opensesame"}
    plain_target = {**DEFINITION, "target": {"url": "postgresql://sync@db/shop", "password": "opensesame"}}
    sqlite_password = {**DEFINITION, "target": {"url": "sqlite:///x.db", "password": {"env": "X"}}}
    cases = [
        (plain_source, "task.source.password"),
        (plain_url, "task.target"),
        (plain_query, "task.target"),
        (plain_target, "task.target.password"),
        (sqlite_password, "task.target.password"),
    ]
    for doc, field in cases:
        with pytest.raises(InvalidError) as raised:
            parse_definition(doc)
        assert raised.value.field == field and raised.value.status == 422, raised.value
        assert "opensesame" not in str(raised.value)
    yaml_text = "id: t\nsource: {kind: mariadb, password: hunter2, database: d}\ntables: [a]\ntarget: sqlite:///a.db\n"
    with pytest.raises(InvalidError, match=r"password: \{env: SHOP_DB_PASSWORD\}") as raised:
        parse_definition_text(yaml_text)
    assert raised.value.field == "task.source.password"


def test_a_definition_round_trips_through_zookeeper_and_the_api_as_references() -> None:
    spec = parse_spec(DEFINITION)
    assert TaskSpec.from_json(spec.to_json()) == spec
    shown = redacted_definition(spec)
    assert shown["source"]["password"] == {"env": "SHOP_DB_PASSWORD"}
    assert shown["target"] == DEFINITION["target"]
    assert parse_definition(shown) == spec  # what the API shows can be saved back as it is
    assert spec.plain_text_secrets() == [] and spec.secrets() == []


def test_a_definition_stored_before_references_still_runs_and_is_shown_redacted() -> None:
    old = {**DEFINITION, "source": {**DEFINITION["source"], "password": "opensesame"}}
    old["target"] = "postgresql://sync:hunter2@db:5432/shop"
    with pytest.raises(TaskSpecError):
        parse_spec(old)
    spec = TaskSpec.from_json(orjson.dumps(old))  # as read from ZooKeeper
    assert spec.plain_text_secrets() == ["task.source.password", "task.target"]
    assert sorted(spec.secrets()) == ["hunter2", "opensesame"]
    shown = orjson.dumps(redacted_definition(spec)).decode()
    assert "opensesame" not in shown and "hunter2" not in shown and "***" in shown
    assert "opensesame" not in repr(spec.source)
    run = resolved(spec, environ={})
    assert reveal(run.source.password) == "opensesame" and run.target == old["target"]
    with pytest.raises(InvalidError) as raised:  # saved back as shown: refused, naming the field
        parse_definition(redacted_definition(spec))
    assert raised.value.field == "task.target" and "{env: SHOP_PG_PASSWORD}" in str(raised.value)
    with pytest.raises(InvalidError) as raised:
        parse_definition({**redacted_definition(spec), "target": "postgresql://sync@db:5432/shop"})
    assert raised.value.field == "task.source.password" and "*** is how" in str(raised.value)


def test_the_worker_resolves_env_and_file_references(tmp_path: Path) -> None:
    secret_file = tmp_path / "shop-pg"
    secret_file.write_text("pg-pass-1\n")
    doc = {
        **DEFINITION,
        "target": {"url": "postgresql://sync@db/shop", "password": {"file": str(secret_file)}},
    }
    spec = parse_spec(doc)
    run = resolved(spec, environ={"SHOP_DB_PASSWORD": "db-pass-1"})
    assert reveal(run.source.password) == "db-pass-1"
    assert isinstance(run.target_password, Secret) and run.target_password.reveal() == "pg-pass-1"
    assert spec.source.password == SecretRef("env", "SHOP_DB_PASSWORD")  # the definition is unchanged
    assert {"db-pass-1", "pg-pass-1"} <= revealed()
    with pytest.raises(SecretError, match="not resolved"):
        reveal(spec.source.password)


def test_a_missing_variable_or_file_fails_naming_the_task_and_where_never_a_value(tmp_path: Path) -> None:
    ref = SecretRef("env", "SHOP_DB_PASSWORD")
    with pytest.raises(SecretError) as raised:
        resolve(ref, task="shop", field=FIELD, environ={"OTHER": "opensesame"})
    text = str(raised.value)
    assert "task shop" in text and FIELD in text and "SHOP_DB_PASSWORD" in text and "not set" in text
    with pytest.raises(SecretError, match="empty"):
        resolve(ref, task="shop", field=FIELD, environ={"SHOP_DB_PASSWORD": ""})
    missing = tmp_path / "nope"
    with pytest.raises(SecretError, match=rf"task shop: {FIELD} names the file {missing}.*cannot read"):
        resolve(SecretRef("file", str(missing)), task="shop", field=FIELD)


def test_a_secret_prints_as_stars_everywhere_but_reveal() -> None:
    secret = Secret("opensesame")
    assert str(secret) == repr(secret) == f"{secret}" == f"{secret!r}" == f"{secret:>20}" == "***"
    assert "opensesame" not in repr([secret, {"password": secret}])
    copied = pickle.loads(pickle.dumps(secret))  # to a Spark task that connects to the source
    assert copied.reveal() == "opensesame" and str(copied) == "***"


def test_a_resolved_definition_never_prints_its_secrets(tmp_path: Path) -> None:
    (tmp_path / "pg").write_text("pg-opensesame")
    doc = {
        **DEFINITION,
        "target": {"url": "postgresql://sync@db/shop", "password": {"file": str(tmp_path / "pg")}},
    }
    run = resolved(parse_spec(doc), environ={"SHOP_DB_PASSWORD": "db-opensesame"})
    assert "opensesame" not in repr(run) and "opensesame" not in f"{run}"
    with pytest.raises(AssertionError):
        run.to_json()  # a resolved definition is never stored


def test_logs_and_error_texts_lose_every_resolved_secret() -> None:
    resolve(SecretRef("env", "X"), task="t", field=FIELD, environ={"X": "resolved-opensesame"})
    assert scrub("refused: resolved-opensesame", []) == "refused: ***"
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(Redactor())
    log = logging.getLogger("test.secrets")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.error("driver said %s", "auth failed for resolved-opensesame")
    finally:
        log.removeHandler(handler)
    assert "resolved-opensesame" not in out.getvalue() and "***" in out.getvalue()


def test_url_passwords_are_found() -> None:
    assert url_has_password("postgresql://u:p@h:5432/db")
    assert url_has_password("postgres://u:@h/db")
    assert url_has_password("postgresql://u@h/db?sslmode=require&password=x")
    assert not url_has_password("postgresql://u@h:5432/db")
    assert not url_has_password("sqlite:////tmp/a.db")

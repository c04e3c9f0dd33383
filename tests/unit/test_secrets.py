"""Secret references in task definitions: parsed and validated at create/update, resolved by the
worker, never printed (issue 17)."""

from __future__ import annotations

import io
import logging
import os
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
    SecretScope,
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
        "password": {"env": "SLUICE_SECRET_SHOP_DB"},
        "database": "shop",
    },
    "tables": ["orders"],
    "target": {"url": "postgresql://sync@db:5432/shop", "password": {"file": "/etc/sluice/secrets/shop-pg"}},
}


def scope_of(directory: Path) -> SecretScope:
    """The default prefix, and `directory` (a test's own) for files."""
    return SecretScope(str(directory))


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
        assert "`password: {env: SLUICE_SECRET_SHOP_DB}`" in str(raised.value)
        assert "`password: {file: /etc/sluice/secrets/shop}`" in str(raised.value)


def test_definitions_with_plain_text_secrets_are_refused_naming_the_field() -> None:
    plain_source = {**DEFINITION, "source": {**DEFINITION["source"], "password": "opensesame"}}
    plain_url = {**DEFINITION, "target": "postgresql://sync:opensesame@db:5432/shop"}
    plain_query = {**DEFINITION, "target": "postgresql://sync@db:5432/shop?password=opensesame"}
    plain_target = {**DEFINITION, "target": {"url": "postgresql://sync@db/shop", "password": "opensesame"}}
    sqlite_password = {**DEFINITION, "target": {"url": "sqlite:///x.db", "password": {"env": "X"}}}
    mysql_url = {**DEFINITION, "target": {"type": "mysql", "url": "mysql://sync:opensesame@db:3306/shop"}}
    cases = [
        (plain_source, "task.source.password"),
        (plain_url, "task.target"),
        (mysql_url, "task.target"),
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
    with pytest.raises(InvalidError, match=r"password: \{env: SLUICE_SECRET_SHOP_DB\}") as raised:
        parse_definition_text(yaml_text)
    assert raised.value.field == "task.source.password"


def test_a_definition_round_trips_through_zookeeper_and_the_api_as_references() -> None:
    spec = parse_spec(DEFINITION)
    assert TaskSpec.from_json(spec.to_json()) == spec
    shown = redacted_definition(spec)
    assert shown["source"]["password"] == {"env": "SLUICE_SECRET_SHOP_DB"}
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
    run = resolved(spec, SecretScope(), environ={})
    assert reveal(run.source.password) == "opensesame" and run.target == old["target"]
    with pytest.raises(InvalidError) as raised:  # saved back as shown: refused, naming the field
        parse_definition(redacted_definition(spec))
    assert raised.value.field == "task.target" and "{env: SLUICE_SECRET_SHOP_PG}" in str(raised.value)
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
    run = resolved(spec, scope_of(tmp_path), environ={"SLUICE_SECRET_SHOP_DB": "db-pass-1"})
    assert reveal(run.source.password) == "db-pass-1"
    assert isinstance(run.target_password, Secret) and run.target_password.reveal() == "pg-pass-1"
    assert spec.source.password == SecretRef("env", "SLUICE_SECRET_SHOP_DB")  # the definition is unchanged
    assert {"db-pass-1", "pg-pass-1"} <= revealed()
    with pytest.raises(SecretError, match="not resolved"):
        reveal(spec.source.password)


def test_a_missing_variable_or_file_fails_naming_the_task_and_where_never_a_value(tmp_path: Path) -> None:
    ref = SecretRef("env", "SLUICE_SECRET_SHOP_DB")
    scope = scope_of(tmp_path)
    with pytest.raises(SecretError) as raised:
        resolve(ref, task="shop", field=FIELD, scope=scope, environ={"OTHER": "opensesame"})
    text = str(raised.value)
    assert "task shop" in text and FIELD in text and "SLUICE_SECRET_SHOP_DB" in text and "not set" in text
    with pytest.raises(SecretError, match="empty"):
        resolve(ref, task="shop", field=FIELD, scope=scope, environ={"SLUICE_SECRET_SHOP_DB": ""})
    missing = tmp_path / "nope"
    with pytest.raises(SecretError, match=rf"task shop: {FIELD} names the file {missing}.*cannot read"):
        resolve(SecretRef("file", str(missing)), task="shop", field=FIELD, scope=scope)


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
    run = resolved(parse_spec(doc), scope_of(tmp_path), environ={"SLUICE_SECRET_SHOP_DB": "db-opensesame"})
    assert "opensesame" not in repr(run) and "opensesame" not in f"{run}"
    with pytest.raises(AssertionError):
        run.to_json()  # a resolved definition is never stored


def test_logs_and_error_texts_lose_every_resolved_secret() -> None:
    resolve(SecretRef("env", "SLUICE_SECRET_X"), task="t", field=FIELD, scope=SecretScope(),
            environ={"SLUICE_SECRET_X": "resolved-opensesame"})  # fmt: skip
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


def test_a_scope_allows_files_under_its_directory_and_variables_with_its_prefix() -> None:
    scope = SecretScope("/etc/sluice/secrets", "SLUICE_SECRET_")
    allowed = [SecretRef("file", "/etc/sluice/secrets/shop"), SecretRef("file", "/etc/sluice/secrets/a/b"),
               SecretRef("env", "SLUICE_SECRET_SHOP_DB")]  # fmt: skip
    assert [scope.refusal(ref, FIELD) for ref in allowed] == [None, None, None]
    refused = {
        SecretRef("file", "/home/sluice/.sluice/cluster/zookeeper-auth.properties"): "secrets.dir",
        SecretRef("file", "/etc/sluice/secrets"): "secrets.dir",
        SecretRef("file", "/etc/sluice/secrets-old/shop"): "secrets.dir",
        SecretRef("file", "/etc/sluice/secrets/../worker.properties"): "'..'",
        SecretRef("file", "/etc/sluice/secrets/./shop"): "'.'",
        SecretRef("file", "/etc/sluice/secrets//shop"): "repeated '/'",
        SecretRef("env", "PGPASSWORD"): "secrets.env.prefix",
        SecretRef("env", "SLUICE_SECRET_"): "secrets.env.prefix",
        SecretRef("env", "XSLUICE_SECRET_A"): "secrets.env.prefix",
    }
    for ref, rule in refused.items():
        refusal = scope.refusal(ref, FIELD)
        assert refusal is not None and refusal.field == FIELD, ref
        assert rule in str(refusal) and str(refusal).startswith(f"{FIELD}.{ref.kind}: "), (ref, str(refusal))
    # plain text of a definition stored before references names nothing: no scope applies
    assert scope.refusal(SecretRef("plain", "opensesame"), FIELD) is None
    for bad_dir in ("relative/dir", "/", "/etc/../etc/sluice", "/a//b"):
        with pytest.raises(ValueError):
            SecretScope(bad_dir)
    for bad_prefix in ("S", "_", "1ABC", "A-B_", ""):
        with pytest.raises(ValueError):
            SecretScope(env_prefix=bad_prefix)
    assert SecretScope("/srv/secrets/").directory == "/srv/secrets"


def test_a_definition_out_of_scope_is_refused_naming_the_field_and_the_rule() -> None:
    from sluice.sync.tasks import check_scope

    spec = parse_spec(DEFINITION)
    check_scope(spec, SecretScope())  # the defaults
    out = parse_spec(
        {**DEFINITION, "target": {"url": "postgresql://x@db/shop", "password": {"file": "/etc/shadow"}}}
    )
    with pytest.raises(
        TaskSpecError, match=r"^task\.target\.password\.file: /etc/shadow is not under /etc/sluice"
    ):
        check_scope(out, SecretScope())
    env = parse_spec(
        {**DEFINITION, "source": {**DEFINITION["source"], "password": {"env": "AWS_SECRET_ACCESS_KEY"}}}
    )
    with pytest.raises(TaskSpecError, match=r"^task\.source\.password\.env: AWS_SECRET_ACCESS_KEY does not"):
        check_scope(env, SecretScope())
    check_scope(env, SecretScope(env_prefix="AWS_"))  # a scope of the cluster's own choosing


def _outside_and_inside(tmp_path: Path) -> tuple[Path, Path]:
    """A credential outside the secrets directory (the worker's ZooKeeper password), and the
    directory with a secret, links in and out, and a FIFO."""
    outside = tmp_path / "zookeeper-auth.properties"
    outside.write_text("zookeeper.auth.password=zk-opensesame\n")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "shop").write_text("pg-pass\n")
    (secrets / "link-in").symlink_to(secrets / "shop")
    (secrets / "link-out").symlink_to(outside)
    (secrets / "dir-out").symlink_to(tmp_path)
    os.mkfifo(secrets / "fifo")
    return outside, secrets


def test_the_worker_refuses_what_its_scope_does_not_allow_whatever_the_definition(tmp_path: Path) -> None:
    """Issue 33 finding 1, at the worker: a definition stored already (or written to ZooKeeper by
    other means) is checked again when the worker resolves it, links followed. Failing run before
    the fix: the worker read the file the definition named, wherever it was:
    `resolve(SecretRef("file", ".../zookeeper-auth.properties"), ...)` returned the ZooKeeper
    password (`reveal()` == "zookeeper.auth.password=zk-opensesame")."""
    outside, secrets = _outside_and_inside(tmp_path)
    scope = scope_of(secrets)
    env = {"SLUICE_SECRET_SHOP_DB": "db-pass", "HOME": "/root", "ZK_PASSWORD": "zk-opensesame"}

    def resolved_value(ref: SecretRef) -> str:
        return resolve(ref, task="shop", field=FIELD, scope=scope, environ=env).reveal()

    assert resolved_value(SecretRef("file", str(secrets / "shop"))) == "pg-pass"
    assert resolved_value(SecretRef("file", str(secrets / "link-in"))) == "pg-pass"
    assert resolved_value(SecretRef("env", "SLUICE_SECRET_SHOP_DB")) == "db-pass"
    refused = {
        SecretRef("file", str(outside)): "secrets.dir",
        SecretRef("file", f"{secrets}/../{outside.name}"): "'..'",
        SecretRef("file", str(secrets / "link-out")): "symbolic link",
        SecretRef("file", str(secrets / "dir-out" / outside.name)): "symbolic link",
        SecretRef("file", str(secrets / "fifo")): "not a regular file",
        SecretRef("file", str(secrets)): "secrets.dir",
        SecretRef("env", "ZK_PASSWORD"): "secrets.env.prefix",
    }
    for ref, rule in refused.items():
        with pytest.raises(SecretError) as raised:
            resolved_value(ref)
        text = str(raised.value)
        assert rule in text and "task shop" in text and "zk-opensesame" not in text, (ref, text)
    # the same through `resolved`, as a worker's execution calls it, for a stored definition
    stored = TaskSpec.from_json(
        orjson.dumps(
            {**DEFINITION, "target": {"url": "postgresql://x@db/shop", "password": {"file": str(outside)}}}
        )
    )
    with pytest.raises(SecretError, match=r"secrets\.dir"):
        resolved(stored, scope, environ=env)


def test_a_link_swapped_in_after_the_check_cannot_lead_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path is resolved, then opened, then the file opened is checked again: a directory
    replaced by a link in between (here: a resolution that did not see the link) is caught by
    the second check."""
    import sluice.security.secrets as secrets_module

    outside, secrets = _outside_and_inside(tmp_path)
    monkeypatch.setattr(secrets_module.os.path, "realpath", lambda p: os.path.abspath(p))
    with pytest.raises(SecretError, match="symbolic link") as raised:
        resolve(SecretRef("file", str(secrets / "dir-out" / outside.name)), task="t", field=FIELD,
                scope=scope_of(secrets))  # fmt: skip
    assert "zk-opensesame" not in str(raised.value)
    with pytest.raises(SecretError, match="cannot read"):  # the last component: not followed at all
        resolve(SecretRef("file", str(secrets / "link-out")), task="t", field=FIELD, scope=scope_of(secrets))


def test_the_worker_settings_give_the_scope() -> None:
    from sluice.properties import ConfigError
    from sluice.sync.worker_config import WorkerConfig

    base = {"bootstrap.servers": "localhost:9092"}
    assert WorkerConfig.from_properties(base).secret_scope == SecretScope(
        "/etc/sluice/secrets", "SLUICE_SECRET_"
    )
    config = WorkerConfig.from_properties(
        {**base, "secrets.dir": "/run/secrets", "secrets.env.prefix": "SHOP_"}
    )
    assert config.secret_scope == SecretScope("/run/secrets", "SHOP_")
    for key, value in (("secrets.dir", "/"), ("secrets.dir", "secrets"), ("secrets.env.prefix", "S")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            WorkerConfig.from_properties({**base, key: value})


def test_a_mysql_target_is_a_url_or_typed_and_the_type_agrees_with_the_url() -> None:
    typed = {"type": "mysql", "url": "mysql://sync@db:3306/copy", "password": {"env": "SLUICE_SECRET_COPY"}}
    spec = parse_spec({**DEFINITION, "target": typed})
    assert spec.target == "mysql://sync@db:3306/copy" and spec.target_password is not None
    assert parse_spec({**DEFINITION, "target": "mariadb://sync@db/copy"}).target == "mariadb://sync@db/copy"
    with pytest.raises(TaskSpecError, match=r"task.target.url: a postgresql target's URL starts with"):
        parse_spec({**DEFINITION, "target": {"type": "postgresql", "url": "mysql://sync@db/copy"}})
    with pytest.raises(
        TaskSpecError, match=r"task.target.type: one of sqlite, postgresql, mysql, delta, not 'oracle'"
    ):
        parse_spec({**DEFINITION, "target": {"type": "oracle", "url": "mysql://sync@db/copy"}})


def test_optimize_every_is_an_option_of_a_delta_target_only() -> None:
    spec = parse_spec({**DEFINITION, "target": "delta:///var/lib/lake", "options": {"optimize_every": 10}})
    assert spec.options["optimize_every"] == 10
    with pytest.raises(TaskSpecError, match=r"task.options.optimize_every: compacts a Delta target's files"):
        parse_spec({**DEFINITION, "target": "mysql://sync@db/copy", "options": {"optimize_every": 10}})
    with pytest.raises(TaskSpecError, match=r"task.options.optimize_every: must be a positive integer"):
        parse_spec({**DEFINITION, "target": "delta:///var/lib/lake", "options": {"optimize_every": 0}})

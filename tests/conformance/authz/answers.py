"""What is compared of an answer: its error codes, top-level and per resource, which of the
case's resources a listing shows, and any field a case names (the KIP-430 authorized
operations); rendered as one line for the differences and the docs.

``codes(response, scope, fields)`` walks the decoded response: every ``error_code`` (and
``*_error_code``: CreateTopics' ``topic_config_error_code``, AddPartitionsToTxn's
``partition_error_code``) under the path of the resources above it (a topic's name, a
partition's index, a group id, ...); for a listed resource of the case that carries no code of
its own (a group in ListGroups, a resource in DescribeAcls), that it is listed; and the value of
each field in ``fields``. Resources outside ``scope`` (the case's names: another case's topics,
internal topics, config entries) are left out: a principal with a wildcard ACL sees the whole
cluster, and only the case's own resources are the case's question.
"""

from __future__ import annotations

from typing import Any

from sluice.protocol.errors import ErrorCode

#: Keys that name the resource a struct is about, in the order they are looked for.
LABELS = (
    "name",
    "topic",
    "group_id",
    "key",
    "resource_name",
    "transactional_id",
    "user",
    "partition_index",
    "partition",
    "index",
    "partition_id",
)
ERROR = "error_code"
LISTED = "listed"
#: The answer of a connection the broker closed instead of answering.
DISCONNECTED = "disconnected"

#: (path, key, value): key is ``error_code``, another ``*_error_code``, ``listed`` or a field
Codes = tuple[tuple[str, str, int | str], ...]


def _label(node: dict[str, Any]) -> Any:
    for key in LABELS:
        if key in node and isinstance(node[key], (str, int)):
            return node[key]
    return None


def _is_code(key: str) -> bool:
    return key == ERROR or key.endswith("_" + ERROR)


def codes(response: dict[str, Any], scope: str, fields: tuple[str, ...] = ()) -> Codes:
    """The error codes, listed resources and ``fields`` of ``response``; ``scope`` is the prefix
    of the case's resource names (``az.<case>.``)."""
    out: list[tuple[str, str, int | str]] = []

    def walk(node: dict[str, Any], path: str) -> None:
        found = False
        for key, value in node.items():
            if _is_code(key):
                out.append((path, key, int(value)))
                found = True
            elif key in fields:
                out.append((path, key, int(value)))
        label = _label(node)
        if not found and isinstance(label, str) and label.startswith(scope):
            out.append((path, LISTED, LISTED))
        for key, value in node.items():
            if not isinstance(value, list):
                continue
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    continue
                label = _label(item)
                if isinstance(label, str) and not (label.startswith(scope) or label.isdigit()):
                    continue  # not the case's (another case's topic, an internal topic, a config)
                step = f"{key}[{i if label is None else label}]"
                walk(item, f"{path}.{step}" if path else step)

    walk(response, "")
    return tuple(sorted(out, key=lambda e: (e[0], e[1], str(e[2]))))


def disconnected() -> Codes:
    return (("", ERROR, DISCONNECTED),)


def code_name(code: int | str) -> str:
    if isinstance(code, str):
        return code
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def render(answer: Codes, roles: dict[str, str]) -> str:
    """One line: ``CODE`` for the top level, ``<path>: CODE`` for a resource (``<path>
    <key>: ...`` for another code or a field), the principal's names replaced by their roles
    (``<topic>``, ``<group>``, ...) so that a line reads the same for every principal of a case."""
    parts = []
    for path, key, value in answer:
        shown = path
        for name, role in sorted(roles.items(), key=lambda kv: -len(kv[0])):
            shown = shown.replace(name, role)
        if key not in (ERROR, LISTED):
            shown = f"{shown} {key}".strip()
        text = code_name(value) if _is_code(key) else str(value)
        parts.append(f"{shown}: {text}" if shown else text)
    return ", ".join(parts) or "(nothing)"

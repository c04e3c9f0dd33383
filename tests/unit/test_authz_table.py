"""The differential authorization suite's own rules, without a cluster: the principals each case
is sent as, what of an answer is compared, and when a difference counts as documented in
docs/COMPATIBILITY.md ("Authorization, API by API")."""

from __future__ import annotations

from pathlib import Path

from sluice.metrics import api_name
from sluice.protocol.api import ApiKey
from sluice.security.acl import Operation, PatternType, Permission, ResourceType
from tests.conformance.authz import documented
from tests.conformance.authz.answers import codes, render
from tests.conformance.authz.cases import CASES, HOST_ELSEWHERE, principals
from tests.conformance.authz.documented import Difference, Row, judge


def test_every_api_key_has_a_case_and_every_case_at_least_three_principals() -> None:
    assert {c.api for c in CASES} == set(ApiKey)
    for case in CASES:
        ps = principals(case)
        assert len(ps) >= 3, case.name
        assert len({p.user for p in ps}) == len(ps), f"{case.name}: a user of its own per principal"


def test_the_neighbours_of_one_needed_acl() -> None:
    case = next(c for c in CASES if c.name == "produce")
    by = {p.variant: p.acls for p in principals(case)}
    topic = "az.produce.t"
    assert by["none"] == ()
    (needed,) = by["needed"]
    assert (needed.rtype, needed.name, needed.pattern, needed.op, needed.permission, needed.host) == (
        ResourceType.TOPIC, topic, PatternType.LITERAL, Operation.WRITE, Permission.ALLOW, "*",
    )  # fmt: skip
    assert [a.op for a in by["wrong-op.topic"]] == [Operation.READ]
    assert [a.name for a in by["wrong-name.topic"]] == ["az.produce.z"]
    assert [(a.pattern, a.name) for a in by["prefixed"]] == [(PatternType.PREFIXED, "az.produce.")]
    assert [(a.pattern, a.name) for a in by["literal-prefix"]] == [(PatternType.LITERAL, "az.produce.")]
    assert [a.name for a in by["wildcard"]] == ["*"]
    assert [a.permission for a in by["deny.topic"]] == [Permission.ALLOW, Permission.DENY]
    assert [a.host for a in by["other-host"]] == [HOST_ELSEWHERE]
    assert [(a.host, a.permission) for a in by["deny-other-host"]] == [
        ("*", Permission.ALLOW), (HOST_ELSEWHERE, Permission.DENY),
    ]  # fmt: skip


def test_codes_are_kept_per_resource_and_other_resources_left_out() -> None:
    response = {
        "throttle_time_ms": 7,
        "topics": [
            {"name": "az.metadata.t", "error_code": 0, "topic_authorized_operations": 256,
             "partitions": [{"partition_index": 0, "error_code": 0}]},
            {"name": "__consumer_offsets", "error_code": 0, "partitions": []},
            {"name": "az.other-case.t", "error_code": 29, "partitions": []},
        ],
        "groups": [{"group_id": "az.metadata.g"}],
    }  # fmt: skip
    got = codes(response, "az.metadata.", fields=("topic_authorized_operations",))
    assert render(got, {"az.metadata.t": "<topic>", "az.metadata.g": "<group>"}) == (
        "groups[<group>]: listed, topics[<topic>]: NONE, topics[<topic>] topic_authorized_operations: 256, "
        "topics[<topic>].partitions[0]: NONE"
    )


def test_a_difference_counts_as_documented_only_as_listed_and_a_listed_one_must_still_occur() -> None:
    row = Row("Fetch", "fetch-session-hijack", frozenset({"needed", "prefixed"}), "NONE", "X", "why")
    ok = Difference("Fetch", "fetch-session-hijack", "needed", "NONE", "X")
    other_principal = Difference("Fetch", "fetch-session-hijack", "none", "NONE", "X")
    other_answer = Difference("Fetch", "fetch-session-hijack", "needed", "NONE", "Y")
    undocumented, stale = judge([ok, other_principal, other_answer], [row])
    assert undocumented == [other_principal, other_answer]
    assert stale == ["Fetch fetch-session-hijack ['prefixed']: kafka='NONE' sluice='X'"]
    assert judge([ok, Difference("Fetch", "fetch-session-hijack", "prefixed", "NONE", "X")], [row]) == (
        [],
        [],
    )


def test_the_compatibility_table_is_read_and_names_real_apis_and_cases(tmp_path: Path) -> None:
    page = tmp_path / "COMPATIBILITY.md"
    page.write_text(
        "# x\n\n## Authorization, API by API\n\ntext\n\n"
        "| API | case | principals | Kafka | Sluice | why |\n|---|---|---|---|---|---|\n"
        "| Fetch | `fetch` | `needed`, `prefixed` | `NONE` | `A \\| B` | because |\n\n## Next\n"
        "| API | case | principals | Kafka | Sluice | why |\n|---|---|---|---|---|---|\n"
        "| a | b | c | d | e | f |\n"
    )
    assert documented.rows(page) == [
        Row("Fetch", "fetch", frozenset({"needed", "prefixed"}), "NONE", "A | B", "because")
    ]
    apis = {api_name(c.api) for c in CASES}
    names = {c.name for c in CASES}
    for r in documented.rows():
        assert r.api in apis and r.case in names, r
        variants = {p.variant for c in CASES if c.name == r.case for p in principals(c)}
        assert r.principals <= variants, r

"""The differential authorization suite (issue 33): for every API key Sluice serves, the same
request sent by many principals (no ACL, exactly the needed ACLs, and neighbouring ones: wrong
operation, wrong name, PREFIXED against LITERAL, a wildcard, a DENY beside the ALLOW, another
host) to Apache Kafka 3.9.1 (SASL_PLAINTEXT, SCRAM, its AclAuthorizer: `sluice peer up kafka
--security sasl_plaintext`) and to a Sluice broker (SASL_SSL, SCRAM, its ACL authorizer); the
error codes compared, top level and per resource (``tests/conformance/authz/``, its table in
``cases.py``).

Every difference is either fixed or listed in docs/COMPATIBILITY.md ("Authorization, API by
API") with its reason; the test fails on a difference that is not listed, and on a listed one
that no longer occurs. It prints one ``authz-difference`` line per differing principal and the
summary ``authz-differential apis=N cases=M differences=D documented=D``.

One one-broker cluster of each for the module, started at once; every principal's SCRAM
credential written into each one's ZooKeeper (Kafka's before it starts: `systems.write_users`),
then both set up with the same admin requests (CreateTopics, CreateAcls, OffsetCommit), and the
cases run on both at once, each principal on a connection of its own. About 80-90 s on a busy
2-core machine (its ``authz-start``, ``authz-setup`` and ``authz-run`` lines say where it
went). Without Kafka's jars (scripts/peers.sh could not reach Maven Central) Sluice's side
still runs, then the comparison is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from sluice.metrics import api_name
from sluice.ops.ports import free_port
from sluice.ops.zookeeper import LocalZooKeeper
from sluice.peers.kafka import CHROOT, PeerError, kafka_libs, peer_down, peer_up
from sluice.protocol.api import ApiKey
from sluice.security.client import PLAINTEXT, ClientSecurity
from tests.conformance.authz import documented
from tests.conformance.authz.answers import Codes, render
from tests.conformance.authz.cases import CASES, Case, Principal, user_of
from tests.conformance.authz.systems import Plan, System, answer, set_up, write_users
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.timeout(420)

#: Kafka's defaults where Sluice's differ (docs/COMPATIBILITY.md): topics made on first Metadata
SLUICE_AS_KAFKA_DEFAULTS = {"auto.create.topics.enable": "true", "default.replication.factor": "1"}

#: one partition per internal topic, as Sluice's test clusters: Kafka's 50 each took 8-22 s to
#: make and load on the first FindCoordinator, and no case asks which partition holds a group
KAFKA_SETTINGS = {"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}

Answers = dict[tuple[str, str], Codes]
#: cases run at once against each system
CASES_AT_ONCE = 4


@contextmanager
def sluice_up(zookeeper: str, directory: Path, users: list[str]) -> Iterator[System]:
    """A one-broker Sluice cluster (SASL_SSL, SCRAM, its ACL authorizer) with ``users``."""
    started = time.monotonic()
    c = TestCluster(zookeeper, directory, 1, broker_settings=SLUICE_AS_KAFKA_DEFAULTS, security="sasl_ssl")
    try:
        # straight into its chroot, with the cluster's ZooKeeper ACLs: a broker reads a user's
        # znode at each login, so they count from the moment they are written
        write_users(c.zookeeper, users, auth=c.cluster.zk_auth())
        print(f"authz-start system=sluice s={time.monotonic() - started:.1f}")
        admin = c.client_security()
        yield System("sluice", c.bootstrap, admin, ClientSecurity("SSL", ca_location=admin.ca_location))
    finally:
        c.down()


@contextmanager
def kafka_up(directory: Path, users: list[str]) -> Iterator[System]:
    """Kafka 3.9.1 (SASL_PLAINTEXT, SCRAM, its AclAuthorizer) with ``users``."""
    started = time.monotonic()
    # its own ZooKeeper without fsync on every commit (the set-up writes some 1,500 znodes)
    zookeeper = LocalZooKeeper(directory / "zookeeper", free_port(), force_sync=False)
    zookeeper.start()
    try:
        # before the broker starts, which loads them all at once (see write_users)
        write_users(zookeeper.connect_string, users, chroot=CHROOT)
        cluster = peer_up(
            directory / "kafka",
            1,
            zookeeper=zookeeper.connect_string,
            security="sasl_plaintext",
            properties=KAFKA_SETTINGS,
        )
        try:
            print(f"authz-start system=kafka s={time.monotonic() - started:.1f}")
            yield System("kafka", cluster.bootstrap_servers, cluster.client_security(), PLAINTEXT)
        finally:
            peer_down(directory / "kafka")
    finally:
        zookeeper.stop()


@pytest.fixture(scope="module")
def systems(
    zookeeper: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[System, System | str]]:
    """Sluice's cluster, and Kafka's or why there is none; both started at once (each takes
    10-40 s on a busy machine: a JVM, a ZooKeeper, TLS material)."""
    users = Plan.of(CASES).users()
    try:
        kafka_libs()
        no_kafka = None
    except PeerError as exc:
        no_kafka = str(exc)
    # the stack is left last: a failure on one side waits for the other to have started (the
    # pool's exit), then stops both
    with ExitStack() as stack:
        with ThreadPoolExecutor(1, thread_name_prefix="authz-kafka-up") as pool:
            kafka = None
            if no_kafka is None:
                kafka = pool.submit(
                    stack.enter_context, kafka_up(tmp_path_factory.mktemp("authz-kafka"), users)
                )
            sluice = stack.enter_context(sluice_up(zookeeper, tmp_path_factory.mktemp("authz-sluice"), users))
            other: System | str = kafka.result() if kafka is not None else str(no_kafka)
        yield sluice, other


def run(system: System, plan: Plan, cases: list[Case]) -> Answers:
    """Set ``system`` up, then every case as each of its principals, in the table's order."""
    took = set_up(system, plan)
    print(f"authz-setup system={system.name} " + " ".join(f"{k}_s={v}" for k, v in took.items()))
    started = time.monotonic()

    def one_case(case: Case) -> Answers:
        """Its principals one after the other, in the table's order (they may meet what the one
        before left: a member id, a deleted offset)."""
        answers: Answers = {}
        for p in plan.principals[case.name]:
            try:
                answers[(case.name, p.variant)] = answer(system, case, p)
            except Exception as exc:
                raise AssertionError(f"{system.name}: case {case.name} as {p.user}: {exc!r}") from exc
        return answers

    # cases touch only their own resources: several at once keep both the broker and the
    # client busy (each principal's connection is a TLS or SCRAM handshake)
    out: Answers = {}
    with ThreadPoolExecutor(CASES_AT_ONCE, thread_name_prefix=f"authz-{system.name}") as pool:
        for answers in pool.map(one_case, cases):
            out.update(answers)
    print(f"authz-run system={system.name} principals={len(out)} s={time.monotonic() - started:.1f}")
    return out


def runnable(
    cases: list[Case], versions: dict[str, dict[int, tuple[int, int]]]
) -> tuple[list[Case], list[str]]:
    """The cases both systems serve at the case's version, and a line for each one skipped."""
    keep, skipped = [], []
    for case in cases:
        missing = [
            name
            for name, served in versions.items()
            if not served.get(int(case.api), (1, 0))[0]
            <= case.version
            <= served.get(int(case.api), (1, 0))[1]
        ]
        if missing:
            skipped.append(
                f"authz-skipped api={api_name(case.api)} case={case.name} version={case.version} "
                f"reason='not served by {', '.join(missing)}'"
            )
        else:
            keep.append(case)
    return keep, skipped


def roles(p: Principal) -> dict[str, str]:
    return {p.names.topic: "<topic>", p.names.group: "<group>", p.names.txn: "<txn>", p.user: "<user>"}


def test_every_api_answers_every_principal_as_kafka_does(
    systems: tuple[System, System | str], request: pytest.FixtureRequest
) -> None:
    """``-vv`` also prints every principal's answers (``authz-same``)."""
    sluice, kafka = systems
    verbose = request.config.getoption("verbose") > 1
    sluice_versions = sluice.api_versions()
    served = {ApiKey(k) for k in sluice_versions if k in {int(a) for a in ApiKey}}
    untested = sorted(k.name for k in served - {c.api for c in CASES})
    assert not untested, f"APIs Sluice serves without a case in tests/conformance/authz/cases.py: {untested}"
    plan = Plan.of(CASES)

    if isinstance(kafka, str):
        cases, skipped = runnable(CASES, {"sluice": sluice_versions})
        run(sluice, plan, cases)
        pytest.skip(f"Sluice's side ran ({len(cases)} cases); the comparison is skipped: {kafka}")

    cases, skipped = runnable(CASES, {"sluice": sluice_versions, "kafka": kafka.api_versions()})
    for line in skipped:
        print(line)
    with ThreadPoolExecutor(2, thread_name_prefix="authz") as pool:
        on_kafka = pool.submit(run, kafka, plan, cases)
        on_sluice = pool.submit(run, sluice, plan, cases)
        k_answers, s_answers = on_kafka.result(), on_sluice.result()

    found: list[documented.Difference] = []
    compared = 0
    for case in cases:
        for p in plan.principals[case.name]:
            compared += 1
            k, s = k_answers[(case.name, p.variant)], s_answers[(case.name, p.variant)]
            if k == s:
                if verbose:
                    print(f'authz-same api={api_name(case.api)} case={case.name} principal=User:{p.user} '
                          f'answer="{render(k, roles(p))}"')  # fmt: skip
                continue
            found.append(
                documented.Difference(
                    api_name(case.api), case.name, p.variant, render(k, roles(p)), render(s, roles(p))
                )
            )
    undocumented, stale = documented.judge(found, documented.rows())
    for d in found:
        print(
            f"authz-difference api={d.api} case={d.case} principal=User:{user_of(d.case, d.principal)} "
            f'kafka="{d.kafka}" sluice="{d.sluice}" documented={"no" if d in undocumented else "yes"}'
        )
    print(
        f"authz-differential apis={len({c.api for c in cases})} cases={compared} "
        f"differences={len(found)} documented={len(found) - len(undocumented)}"
    )
    assert not undocumented, (
        "differences from Kafka not listed in docs/COMPATIBILITY.md (Authorization, API by API): "
        + "; ".join(f"{d.api} {d.case} {d.principal}" for d in undocumented)
    )
    assert not stale, f"listed in docs/COMPATIBILITY.md but no longer different (remove them): {stale}"

"""The PostgreSQL source's pure parts: its task definition, its type names, its values from
PostgreSQL's text, its positions, pgoutput's framing."""

from __future__ import annotations

import struct

import pytest

from sluice.sync.sources import pg_proto
from sluice.sync.sources.pg_values import converter
from sluice.sync.sources.postgresql import SUB_POSITIONS, default_object_name
from sluice.sync.tasks import TaskSpecError, parse_spec
from sluice.sync.types import parse_type, postgres_type, sqlite_type


def spec(**source: object) -> dict[str, object]:
    return {"id": "pg", "source": {"kind": "postgresql", "database": "shop", **source},
            "tables": ["orders"], "target": "sqlite:///t.db"}  # fmt: skip


def test_a_postgresql_source_takes_postgresqls_defaults_and_its_own_fields() -> None:
    s = parse_spec(spec(publication="pub_1", slot="slot_1", schema="sales")).source
    assert (s.port, s.user, s.publication, s.slot, s.schema) == (5432, "postgres", "pub_1", "slot_1", "sales")
    assert parse_spec(spec(port=6543, user="me")).source.port == 6543


@pytest.mark.parametrize(
    ("field", "value"),
    [("slot", "Bad-Name"), ("publication", "1x"), ("slot", "x" * 64), ("schema", "a b")],
)
def test_bad_slot_publication_and_schema_names_are_refused(field: str, value: str) -> None:
    with pytest.raises(TaskSpecError, match=f"task.source.{field}"):
        parse_spec(spec(**{field: value}))


def test_only_a_postgresql_source_has_a_slot() -> None:
    doc = {"id": "m", "source": {"kind": "mariadb", "database": "shop", "slot": "s"}, "tables": ["t"],
           "target": "sqlite:///t.db"}  # fmt: skip
    with pytest.raises(TaskSpecError, match="only a postgresql source has one"):
        parse_spec(doc)


def test_the_ddl_trigger_and_decoding_memory_settings_are_checked() -> None:
    assert parse_spec(spec(ddl_trigger=True)).source.ddl_trigger is True
    with pytest.raises(TaskSpecError, match=r"task\.source\.ddl_trigger: true or false"):
        parse_spec(spec(ddl_trigger="yes"))
    mariadb = {"id": "m", "source": {"kind": "mariadb", "database": "shop", "ddl_trigger": True},
               "tables": ["t"], "target": "sqlite:///t.db"}  # fmt: skip
    with pytest.raises(TaskSpecError, match="only a postgresql source has one"):
        parse_spec(mariadb)
    assert parse_spec({**spec(), "options": {"logical_decoding_work_mem": "64kB"}}).options
    for bad in ("64", "1 GB", "0MB", "64mb"):
        with pytest.raises(TaskSpecError, match=r"task\.options\.logical_decoding_work_mem: must be a size"):
            parse_spec({**spec(), "options": {"logical_decoding_work_mem": bad}})


def test_a_postgresql_source_needs_its_database_and_tables() -> None:
    with pytest.raises(TaskSpecError, match="needs the database name"):
        parse_spec({"id": "p", "source": {"kind": "postgresql"}, "tables": ["t"], "target": "sqlite:///t.db"})
    with pytest.raises(TaskSpecError, match="needs the tables"):
        parse_spec({**spec(), "tables": []})


def test_default_names_are_valid_postgresql_identifiers() -> None:
    assert default_object_name("Shop.Orders-2") == "sluice_shop_orders_2"
    assert len(default_object_name("x" * 63)) == 63


@pytest.mark.parametrize(
    ("source_type", "family", "pg", "lite"),
    [
        ("pg:integer", "int", "integer", "INTEGER"),
        ("pg:numeric", "decimal", "numeric", "TEXT"),
        ("pg:numeric(12,2)", "decimal", "numeric(12,2)", "TEXT"),
        ("pg:timestamp(3) with time zone", "temporal", "timestamp(3) with time zone", "TEXT"),
        ("pg:character varying(20)[]", "array", "character varying(20)[]", "TEXT"),
        ("pg:money", "money", "numeric(19,2)", "TEXT"),
        ("pg:enum", "enum", "text", "TEXT"),
        ("pg:enum[]", "array", "text[]", "TEXT"),
        ("pg:hstore", "other", "text", "TEXT"),
        ("pg:citext", "other", "text", "TEXT"),
        ("pg:int4range", "native", "int4range", "TEXT"),
        ("pg:boolean", "bool", "boolean", "INTEGER"),
        # a MySQL type of the same name keeps MySQL's mapping
        ("timestamp(3)", "temporal", "timestamp(3) with time zone", "TEXT"),
        ("int(10) unsigned", "int", "bigint", "INTEGER"),
    ],
)
def test_postgresql_types_map_to_themselves_where_postgresql_has_them(
    source_type: str, family: str, pg: str, lite: str
) -> None:
    assert parse_type(source_type).family == family
    assert postgres_type(source_type) == pg
    assert sqlite_type(source_type) == lite


@pytest.mark.parametrize(
    ("source_type", "text", "value"),
    [
        ("pg:bigint", "-9223372036854775808", -9223372036854775808),
        ("pg:real", "1.1", 1.1),
        ("pg:double precision", "NaN", "NaN"),
        ("pg:double precision", "-0", "-0"),
        ("pg:double precision", "-Infinity", "-Infinity"),
        ("pg:money", "-$92,233,720,368,547,758.08", "-92233720368547758.08"),
        ("pg:money", "$0.00", "0.00"),
        ("pg:boolean", "t", True),
        ("pg:boolean", "f", False),
        ("pg:bytea", "\\x00ff", b"\x00\xff"),
        ("pg:timestamp without time zone", "2024-02-29 12:34:56.789", "2024-02-29T12:34:56.789"),
        ("pg:timestamp without time zone", "0044-03-15 10:00:00 BC", "0044-03-15T10:00:00 BC"),
        ("pg:timestamp with time zone", "2020-01-01 00:00:00+00", "2020-01-01T00:00:00Z"),
        ("pg:timestamp with time zone", "0001-01-01 00:00:00+00 BC", "0001-01-01T00:00:00Z BC"),
        ("pg:timestamp with time zone", "infinity", "infinity"),
        ("pg:numeric", "NaN", "NaN"),
        ("pg:integer[]", "{1,NULL}", "{1,NULL}"),
    ],
)
def test_values_from_postgresqls_text(source_type: str, text: str, value: object) -> None:
    assert converter(source_type)(text) == value


def test_a_bytea_not_in_hex_output_is_refused() -> None:
    with pytest.raises(ValueError, match="bytea_output=hex"):
        converter("pg:bytea")("abc")


def test_sub_positions_stay_below_the_next_commit_record() -> None:
    # a commit record is a 24-byte header and at least 8 bytes of body, 8-byte aligned: the next
    # transaction's commit LSN is at least 32 above this one's
    assert SUB_POSITIONS <= 32


def test_pgoutput_messages_decode_and_a_truncated_one_is_refused() -> None:
    begin = b"B" + struct.pack(">QqI", 0x1969E40, 0, 737)
    assert pg_proto.decode(begin) == pg_proto.Begin(0x1969E40, pg_proto.PG_EPOCH_MS, 737)
    relation = (
        b"R" + struct.pack(">I", 16389) + b"public\x00t\x00" + b"d" + struct.pack(">h", 2)
        + b"\x01id\x00" + struct.pack(">Ii", 23, -1) + b"\x00v\x00" + struct.pack(">Ii", 25, -1)
    )  # fmt: skip
    rel = pg_proto.decode(relation)
    assert isinstance(rel, pg_proto.Relation)
    assert [(c.name, c.type_oid, c.key) for c in rel.columns] == [("id", 23, True), ("v", 25, False)]
    update = (
        b"U" + struct.pack(">I", 16389) + b"N" + struct.pack(">h", 2) + b"t" + struct.pack(">i", 1) + b"1u"
    )
    assert pg_proto.decode(update) == pg_proto.Update(16389, None, False, (("t", b"1"), ("u", None)))
    with pytest.raises(pg_proto.ProtocolError, match="ends after"):
        pg_proto.decode(begin[:-1])
    for cut in (1, 3, 6):
        with pytest.raises(pg_proto.ProtocolError, match=r"ends after|left after|where its"):
            pg_proto.decode(update[:-cut])
    with pytest.raises(pg_proto.ProtocolError, match="2 bytes left after a Update"):
        pg_proto.decode(update + b"xx")
    with pytest.raises(pg_proto.ProtocolError, match="not one of protocol version 2"):
        pg_proto.decode(b"P\x00\x00\x00\x01")  # Prepare: two-phase commit, never asked for
    # version 2's stream messages, and the xid a change carries inside a stream block
    assert pg_proto.decode(b"S\x00\x00\x02\xe1\x01") == pg_proto.StreamStart(737, True)
    assert pg_proto.decode(b"E") == pg_proto.StreamStop()
    commit = b"c" + struct.pack(">IbQQq", 737, 0, 0x1969E40, 0x1969E78, 1000)
    ms = pg_proto.PG_EPOCH_MS + 1
    assert pg_proto.decode(commit) == pg_proto.StreamCommit(737, 0x1969E40, 0x1969E78, ms)
    assert pg_proto.decode(b"A" + struct.pack(">II", 737, 740)) == pg_proto.StreamAbort(737, 740)
    xid, inner = pg_proto.streamed(update[:1] + struct.pack(">I", 740) + update[1:])
    assert (xid, pg_proto.decode(inner)) == (740, pg_proto.decode(update))
    with pytest.raises(pg_proto.ProtocolError, match="inside a stream block carries no xid"):
        pg_proto.streamed(begin)
    assert pg_proto.parse_lsn(pg_proto.lsn_text(0x16B374D848)) == 0x16B374D848
    assert pg_proto.lsn_text(0x16B374D848) == "16/B374D848"


def test_the_slot_alarm_is_raised_once_past_its_limit_and_again_only_after_it_fell_below_half() -> None:
    from sluice.pipeline.execution import slot_alarm

    assert slot_alarm(10, "reserved", 100, False) == (False, False)
    assert slot_alarm(101, "reserved", 100, False) == (True, True)
    assert slot_alarm(150, "extended", 100, True) == (False, True)  # raised already
    assert slot_alarm(60, "reserved", 100, True) == (False, True)  # not yet below half
    assert slot_alarm(40, "reserved", 100, True) == (False, False)  # re-armed
    assert slot_alarm(1, "unreserved", 100, False) == (True, True)  # the server may drop its WAL

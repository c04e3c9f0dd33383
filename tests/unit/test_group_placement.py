from hypothesis import given
from hypothesis import strategies as st

from sluice.broker.group_placement import java_string_hash, kafka_abs, partition_for_group


def test_polygenelubricants_hashes_to_int_min_and_lands_on_partition_0() -> None:
    assert java_string_hash("polygenelubricants") == -2147483648
    assert kafka_abs(-2147483648) == 0
    assert partition_for_group("polygenelubricants", 50) == 0


def test_my_group_lands_on_partition_12() -> None:
    assert partition_for_group("my-group", 50) == 12


def test_known_java_hashes() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    # A character outside the BMP hashes as its two UTF-16 surrogates.
    assert java_string_hash("\U0001f600") == (31 * 0xD83D + 0xDE00)


@given(st.text(max_size=40), st.integers(1, 200))
def test_partition_is_always_in_range(group: str, partitions: int) -> None:
    assert 0 <= partition_for_group(group, partitions) < partitions

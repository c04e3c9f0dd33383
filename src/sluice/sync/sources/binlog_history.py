"""Which binlog history a capture position belongs to, and where to go on when it changed.

A binlog position (`mysql-bin.000003:1234`) means something only in the history of the server
that wrote it. `RESET MASTER` starts a new history at `mysql-bin.000001:4`; a replica promoted
to primary has a history of its own, with its own file names and offsets. Read from there as if
nothing happened, the capture would give its changes positions below the ones already in the
log, and the targets' version guard would drop every one of them as stale.

So a capture keeps two things besides the position:

- its GTID state at every place it may resume from (`GtidTrail`): MariaDB's `domain-server-seq`
  per domain, or MySQL's `uuid:1-n` per source. On MariaDB, `BINLOG_GTID_POS(file, pos)` tells
  the server's own state at a position; when it differs from the capture's (or the file is
  gone), the position is not in this server's history any more (`same_history`). The capture
  asks before every binlog pass and at every start.
- a base (`source.base`) added to every encoded position of a history, and the highest position
  it has emitted (`source.high`). When the history changes, the new base is `next_base(high)`,
  so every position of the new history is above every one written before: the targets apply
  the new history's changes over the old one's rows.

Where it goes on (`MySqlCapture._continue_in_new_history`): from its GTID state, which the
server finds in the new history when the transactions it had captured are there (a replica
promoted with log_slave_updates, or RESET MASTER followed by `SET GLOBAL gtid_binlog_state` to
the old state). Nothing is missed then. When the server does not have them (RESET MASTER alone,
a replica that was behind), changes made between the last captured one and the change of
history are gone from every binlog: the capture reads the new history from its oldest file,
raises the `source-history-changed` alarm with `continuous=false`, and `sluice task verify
--repair` finds what it could not see.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

#: The alarm a task raises when its source's binlog history changed under it.
HISTORY_CHANGED = "source-history-changed"
#: GTID positions kept per capture: a bound, though the trail is pruned to the resume position
#: as transactions are acknowledged (at most the transactions in flight are held).
TRAIL_MAX = 100_000


def parse_state(text: str | None) -> dict[str, str]:
    """A GTID state (MariaDB `0-1-5,1-2-9`; MySQL `uuid:1-5,uuid2:1-9`) as one entry per
    domain (MariaDB) or source (MySQL), comparable whatever the order of the text."""
    state: dict[str, str] = {}
    for part in (text or "").replace("\n", "").split(","):
        apply_gtid(state, part.strip())
    return state


def apply_gtid(state: dict[str, str], gtid: str) -> None:
    """Put one transaction's GTID (or a state's entry) into `state`: the newest per MariaDB
    domain or MySQL source."""
    if ":" in gtid:  # MySQL: uuid:n, or uuid:1-n in a state
        state[gtid.split(":", 1)[0]] = gtid
    elif gtid:  # MariaDB: domain-server-seq
        state[gtid.split("-", 1)[0]] = gtid


def state_text(state: dict[str, str]) -> str:
    """The state as a server takes it to start from: MariaDB's `0-1-5,1-2-9`; MySQL's
    `uuid:1-n` (every transaction of that source up to n was captured, in order)."""
    parts = []
    for _, gtid in sorted(state.items()):
        if ":" in gtid and "-" not in gtid.split(":", 1)[1]:
            source, number = gtid.rsplit(":", 1)
            parts.append(f"{source}:1-{number}")
        else:
            parts.append(gtid)
    return ",".join(parts)


def same_history(recorded: str | None, server: str | None) -> bool:
    """Whether a position is in the server's history: the server's GTID state there
    (`BINLOG_GTID_POS`; None when the file is gone or the offset starts no event) equals the
    one the capture recorded there. Without a recorded state, only the file being there says so."""
    if server is None:
        return False
    if not recorded:
        return True
    return parse_state(recorded) == parse_state(server)


def next_base(high: int) -> int:
    """The base of a new history: above every position emitted before (`high`)."""
    return high + 1


class GtidTrail:
    """The capture's GTID state at each place it may resume from (transaction boundaries, in
    binlog order), and the state as the binlog is read (`note_gtid`, `commit`)."""

    def __init__(self) -> None:
        self._at: OrderedDict[str, str] = OrderedDict()
        self.state: dict[str, str] = {}
        self._pending = ""  # the GTID of the transaction being read

    def start(self, position: str, state_text: str) -> None:
        """Reading begins at `position`, where the state is `state_text` (the server's, or the
        recorded one when going on from a GTID)."""
        self.state = parse_state(state_text)
        self._pending = ""
        self.record(position)

    def note_gtid(self, gtid: str) -> None:
        """A transaction begins: the one before it (if its end was not seen) is whole."""
        self._apply()
        self._pending = gtid

    def commit(self, position: str) -> None:
        """The transaction read ends at `position`."""
        self._apply()
        self.record(position)

    def record(self, position: str) -> None:
        self._at[position] = self.text()
        self._at.move_to_end(position)
        while len(self._at) > TRAIL_MAX:
            self._at.popitem(last=False)

    def at(self, position: str) -> str:
        """The state recorded at `position` ("" when unknown)."""
        return self._at.get(position, "")

    def forget_before(self, position: str) -> None:
        """Drop the states of positions before `position` (a resume position: never needed again)."""
        if position not in self._at:
            return
        while self._at and next(iter(self._at)) != position:
            self._at.popitem(last=False)

    def text(self) -> str:
        return state_text(self.state)

    def _apply(self) -> None:
        if self._pending:
            apply_gtid(self.state, self._pending)
            self._pending = ""


def server_state_at(conn: Any, file: str, pos: int) -> str | None:
    """MariaDB's GTID state at a binlog position (None: the file is gone or `pos` starts no
    event there)."""
    with conn.cursor() as cur:
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, int(pos)))
        row = cur.fetchone()
    return None if row is None or row[0] is None else str(row[0])

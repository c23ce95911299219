"""P4Runtime for the bmv2 plane: a synchronous client of one simple_switch_grpc.

Where simple_switch_grpc is on PATH, the bmv2 plane (incast.dataplane.bmv2) starts it
without a program and programs it as a P4 controller does: this client connects as
the switch's primary (a device id and an election id), pushes the pipeline (the P4Info
p4c writes beside the JSON, and the bmv2 JSON as the p4_device_config), writes the
table entries and default actions, the multicast groups and the clone sessions, and
reads the counters. Every table, match field, action, parameter and counter is named
as the P4 source names it; the P4Info turns each name into its id (finsy's P4Schema),
so no id of a compiled program is written in Python.

It also reads the program's registers (occ_bytes, the hold loops' heads and tails,
the PAUSE clocks, ...) as RegisterEntry. Upstream PI answers those "Register reads are
not supported yet" (p4lang/PI#376); scripts/install-p4.sh --grpc builds PI and bmv2
with scripts/p4-patches/, which serve them. The egress queues' depth and rate have no
P4Runtime entity (bmv2 keeps its queues outside the P4 program): the patched
simple_switch_grpc takes them from a file at start (--queue-config), as a switch takes
its port and queue configuration from its chassis configuration rather than from
P4Runtime. With those patches no Thrift session is opened; a simple_switch_grpc
without them (bmv2.queue_config_supported) still gets its queues and register reads
over Thrift (bmv2.CliSession).

The client is built on finsy's P4Client (grpc.aio) and its P4Schema and entity
classes. finsy is asyncio-based: one event loop for the whole process runs in a daemon
thread and the synchronous methods here submit coroutines to it
(asyncio.run_coroutine_threadsafe). A client is kept for a switch's whole life: its
stream channel is what makes it the primary, and closing it ends that.

Every message the client sends is counted by kind (messages, the updates of its
WriteRequests by entity, the entities of its ReadRequests), and every WriteRequest is
kept in protobuf text format, annotated with the P4Info's names: the run's
switch.p4rt.txt.
"""
from __future__ import annotations

import asyncio
import collections
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

# finsy, imported at first use (_load): with grpc and protobuf it costs a tenth of a
# second, which every `incast` command would otherwise pay (the labs import this plane).
finsy = pbutil = P4RuntimeVersion = p4r = None
IMPORT_ERROR: str | None = None


def _load() -> None:
    global finsy, pbutil, P4RuntimeVersion, p4r, IMPORT_ERROR
    if finsy is not None or IMPORT_ERROR is not None:
        return
    try:
        import finsy as lib                 # late: with grpc 0.1 s; only P4Runtime needs it
        from finsy import pbutil as lib_pbutil                      # late: as finsy
        from finsy.p4schema import P4RuntimeVersion as lib_version  # late: as finsy
        from finsy.proto import p4r as lib_p4r                      # late: as finsy
    except ImportError as e:        # the plane then runs over Thrift alone
        IMPORT_ERROR = f"{e}"
        return
    finsy, pbutil, P4RuntimeVersion, p4r = lib, lib_pbutil, lib_version, lib_p4r

ELECTION_ID = 10            # ours: a reader that is not the controller bids lower
CONNECT_TIMEOUT_S = 30.0
RPC_TIMEOUT_S = 120.0      # as the Thrift CLI session waits (bmv2.CliSession)


def missing() -> str | None:
    """Why this machine cannot program a switch over P4Runtime, or None."""
    _load()
    if finsy is None:
        return f"the P4Runtime client library finsy is not installed ({IMPORT_ERROR})"
    return None


# --- What the plane asks of a switch, by name ----------------------------------------
# Each is rendered both as a simple_switch_CLI command (the Thrift path, and the
# switch.cli a person can replay) and as a P4Runtime entity.

@dataclass(frozen=True)
class Entry:
    """A table entry (match: field name -> value) or, default=True, a table's default
    action. params: the action's parameters by name, in the action's order. modify: a
    new action for an entry the table has (P4Runtime MODIFY; Thrift's table_modify
    names the entry by a handle, which only the switch knows)."""
    table: str
    action: str
    params: dict = field(default_factory=dict)
    match: dict = field(default_factory=dict)
    default: bool = False
    modify: bool = False

    def cli(self) -> str:
        args = " ".join(map(_cli_value, self.params.values()))
        if self.default:
            return f"table_set_default {self.table} {self.action} {args}".rstrip()
        if self.modify:
            raise ValueError(f"{self.table}: a modified entry has no CLI line without its handle")
        keys = " ".join(map(_cli_value, self.match.values()))
        return f"table_add {self.table} {self.action} {keys} => {args}".rstrip()

    def entity(self):
        _load()
        action = finsy.P4TableAction(self.action, **{k: _int(v) for k, v in self.params.items()})
        if self.default:
            return ~finsy.P4TableEntry(self.table, action=action, is_default_action=True)
        entry = finsy.P4TableEntry(self.table, match=finsy.P4TableMatch(
            {k: _int(v) for k, v in self.match.items()}), action=action)
        return ~entry if self.modify else +entry

    def same(self) -> tuple:
        """What the switch keeps of it (values as integers), to compare with a read."""
        return (self.table, self.action, self.default, tuple(sorted((k, _int(v)) for k, v in self.match.items())),
                tuple((k, _int(v)) for k, v in self.params.items()))


def _int(value) -> int:
    """A value as an integer: a MAC address (02:00:...) as its 48 bits."""
    return int(value.replace(":", ""), 16) if isinstance(value, str) and ":" in value else int(value)


def _cli_value(value) -> str:
    return value if isinstance(value, str) else str(int(value))


@dataclass(frozen=True)
class Group:
    """A multicast group: a copy to each port, with replication id (P4Runtime's
    instance) rid. node: the handle bmv2's Thrift PRE gives its one node (nodes are
    numbered in the order they are made)."""
    group: int
    ports: tuple
    rid: int = 0
    node: int = 0

    def same(self) -> tuple:
        return ("group", self.group, tuple(sorted(self.ports)), self.rid)

    def cli(self) -> list[str]:
        return [f"mc_mgrp_create {self.group}", f"mc_node_create {self.rid} {' '.join(map(str, self.ports))}",
                f"mc_node_associate {self.group} {self.node}"]

    def entity(self):
        _load()
        return +finsy.P4MulticastGroupEntry(self.group, replicas=[(p, self.rid) for p in self.ports])


@dataclass(frozen=True)
class Clone:
    """A clone (mirroring) session: to one port, or to every port of multicast group
    `group` (Thrift: mirroring_add_mc; P4Runtime: a session with a replica at each of
    the group's ports)."""
    session: int
    ports: tuple
    group: int | None = None

    def same(self) -> tuple:
        return ("clone", self.session, tuple(sorted(self.ports)))

    def cli(self) -> list[str]:
        if self.group is not None:
            return [f"mirroring_add_mc {self.session} {self.group}"]
        assert len(self.ports) == 1, self
        return [f"mirroring_add {self.session} {self.ports[0]}"]

    def entity(self):
        _load()
        return +finsy.P4CloneSessionEntry(self.session, replicas=[(p, 0) for p in self.ports])


def cli_lines(item) -> list[str]:
    """A plane's command (a CLI line, or an Entry, Group or Clone) as CLI lines."""
    if isinstance(item, str):
        return [item]
    out = item.cli()
    return [out] if isinstance(out, str) else out


# --- The event loop ------------------------------------------------------------------

class _Loop:
    """One asyncio loop for the process, in a daemon thread (grpc.aio channels belong
    to the loop that made them: every client uses this one)."""
    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run():
                    # Served only when nothing else wants the CPU, as the Thrift CLI is
                    # (bmv2.CliSession): encoding and decoding a read while packets flow
                    # then waits for bmv2 instead of bmv2 for it. (This thread only.)
                    try:
                        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                    except (AttributeError, PermissionError, OSError):
                        pass
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()
                threading.Thread(target=run, name="p4runtime-loop", daemon=True).start()
                started.wait()
                cls._loop = loop
            return cls._loop


def _run(coro, timeout: float = RPC_TIMEOUT_S):
    return asyncio.run_coroutine_threadsafe(coro, _Loop.get()).result(timeout)


# --- The client ----------------------------------------------------------------------

class P4RuntimeFailed(RuntimeError):
    """A P4Runtime request the switch refused, or one that did not complete."""


class Runtime:
    """A P4Runtime client of one switch (address: grpc's, e.g. unix:/run/... or
    127.0.0.1:50051). primary=True: bid election_id to be the switch's primary (the
    controller); primary=False: a reader that never arbitrates (reads only)."""

    def __init__(self, address: str, p4info: Path, device_config: Path | None = None, *, device_id: int = 0,
                 election_id: int = ELECTION_ID, primary: bool = True, name: str = ""):
        reason = missing()
        if reason:
            raise P4RuntimeFailed(reason)
        self.address, self.device_id, self.election_id = address, device_id, election_id
        self.primary = primary
        self.name = name or address
        self.schema = finsy.P4Schema(Path(p4info), Path(device_config) if device_config else None)
        self.messages: collections.Counter = collections.Counter()    # kind -> messages sent
        self.updates: collections.Counter = collections.Counter()     # entity kind -> updates written
        self.read_entities: collections.Counter = collections.Counter()
        self.written: list[str] = []        # each WriteRequest, in text format
        self.stream_errors: list[str] = []  # error messages the switch sent on the stream
        # Arbitration updates after ours: another controller with a higher election id
        # became the primary (lost_primary: we read on as a backup; the switch refuses
        # our writes) or the one above us left (regained_primary). A run's tables are
        # the testbed's view of the switch; this says someone else may have changed it.
        self.arbitration: collections.Counter = collections.Counter()
        self.backup = False
        self.client = None
        self._drain = None

    # -- the connection

    def connect(self, timeout: float = CONNECT_TIMEOUT_S) -> "Runtime":
        try:
            _run(self._connect(), timeout)
        except BaseException:
            self.close()
            raise
        return self

    async def _connect(self):
        self.client = finsy.P4Client(self.address, wait_for_ready=True)
        await self.client.open(schema=self.schema)
        if self.primary:
            await self.client.send(p4r.StreamMessageRequest(arbitration=p4r.MasterArbitrationUpdate(
                device_id=self.device_id, election_id=self._election())))
            self.messages["StreamMessageRequest.arbitration"] += 1
            reply = await self.client.receive()
            status = reply.arbitration.status
            if reply.WhichOneof("update") != "arbitration" or status.code != 0:
                raise P4RuntimeFailed(f"{self.name}: not the primary P4Runtime client "
                                    f"(status {status.code}: {status.message})")
            self._drain = asyncio.ensure_future(self._drain_stream())
        reply = await self._request(p4r.CapabilitiesRequest())
        self.schema.set_p4runtime_version(P4RuntimeVersion.parse(reply.p4runtime_api_version))

    async def _drain_stream(self):
        """Read what the switch sends on the stream (arbitration updates, errors) for
        as long as it is open: an unread stream would fill. When it ends the switch is
        gone (a run ends its switches with its namespace, not one by one): the channel
        is closed then, so that none is left retrying."""
        client = self.client
        try:
            while True:
                msg = await client.receive()
                if msg.WhichOneof("update") == "error":
                    self.stream_errors.append(pbutil.to_text(msg))
                elif msg.WhichOneof("update") == "arbitration":
                    # bmv2's PI: ALREADY_EXISTS ("Is backup") naming the new primary's
                    # id when a higher bid takes over; OK ("Is primary") when it leaves.
                    # Counted as changes of role, whatever else the switch repeats.
                    backup = msg.arbitration.status.code != 0
                    if backup != self.backup:
                        self.backup = backup
                        self.arbitration["lost_primary" if backup else "regained_primary"] += 1
        except asyncio.CancelledError:
            return
        except Exception:   # noqa: BLE001  the stream broke: the switch is gone
            await client.close()

    def _election(self):
        return p4r.Uint128(high=0, low=self.election_id)

    async def _request(self, msg):
        kind = type(msg).__name__
        self.messages[kind] += 1
        try:
            return await self.client.request(msg)
        except finsy.P4ClientError as e:
            raise P4RuntimeFailed(f"P4Runtime {kind} to {self.name} failed: {e}") from None

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None

            async def _close():
                if self._drain is not None:
                    self._drain.cancel()
                await client.close()
            try:
                _run(_close(), 10)
            except Exception:
                pass

    # -- the pipeline

    def push_pipeline(self) -> None:
        """Install the program (P4Info and bmv2 JSON): VERIFY_AND_COMMIT. Doing it
        again wipes every entry and counter."""
        _run(self._request(p4r.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, election_id=self._election(),
            action=p4r.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
            config=self.schema.get_pipeline_config())))

    # -- writes

    def write(self, items) -> None:
        """One WriteRequest with an update for each Entry, Group and Clone of items."""
        updates = [item.entity().encode_update(self.schema) for item in items]
        if not updates:
            return
        request = p4r.WriteRequest(device_id=self.device_id, election_id=self._election(), updates=updates)
        for u in updates:
            what = u.entity.WhichOneof("entity")
            if what == "packet_replication_engine_entry":
                what = u.entity.packet_replication_engine_entry.WhichOneof("type")
            elif what == "table_entry" and u.entity.table_entry.is_default_action:
                what = "table_entry (default action)"
            self.updates[what] += 1
        self.written.append(f"# WriteRequest {len(self.written) + 1} of {self.name}\n" + self.text(request))
        _run(self._request(request))

    def text(self, msg) -> str:
        """A message in protobuf text format, ids annotated with their P4Info names."""
        return pbutil.log_annotate(pbutil.to_text(msg, as_one_line=False, custom_format=True), self.schema)

    # -- reads

    def _read(self, entities) -> list:
        request = p4r.ReadRequest(device_id=self.device_id,
                                  entities=[e.encode(self.schema) for e in entities])
        for e in request.entities:
            self.read_entities[e.WhichOneof("entity")] += 1

        async def go():
            self.messages["ReadRequest"] += 1
            out = []
            try:
                async for reply in self.client.request_iter(request):
                    out += reply.entities
            except finsy.P4ClientError as e:
                raise P4RuntimeFailed(f"P4Runtime ReadRequest to {self.name} failed: {e}") from None
            return out
        return _run(go())

    def read_counters(self, cells) -> list[tuple[int, int]]:
        """(packets, bytes) of each (counter name, index) of cells, in one ReadRequest;
        index None reads the whole array (then the list has one per cell, by index)."""
        cells = list(cells)
        if not cells:
            return []
        got = {}
        whole = {}
        for ent in self._read([finsy.P4CounterEntry(name, index=i) for name, i in cells]):
            e = finsy.P4CounterEntry.decode(ent, self.schema)
            value = (e.packet_count, e.byte_count)
            got[(e.counter_id, e.index)] = value
            whole.setdefault(e.counter_id, {})[e.index] = value
        out = []
        for name, i in cells:
            alias = self.schema.counters[name].alias
            if i is None:
                cells_of = whole.get(alias, {})
                out += [cells_of[k] for k in sorted(cells_of)]
            else:
                out.append(got[(alias, i)])
        return out

    def read_registers(self, cells) -> list[int]:
        """The value of each (register name, index) of cells, in one ReadRequest;
        index None reads the whole array (then the list has one per cell, by index).
        A server without register reads refuses it: P4RuntimeFailed."""
        cells = list(cells)
        if not cells:
            return []
        whole = {}
        for ent in self._read([finsy.P4RegisterEntry(name, index=i) for name, i in cells]):
            e = finsy.P4RegisterEntry.decode(ent, self.schema)
            whole.setdefault(e.register_id, {})[e.index] = int(e.data)
        out = []
        for name, i in cells:
            cells_of = whole.get(self.schema.registers[name].alias, {})
            out += [cells_of[k] for k in sorted(cells_of)] if i is None else [cells_of[i]]
        return out

    def read_tables(self, tables=None) -> list[Entry]:
        """The entries of these tables (all, when None), default actions included, as
        Entry (names as the P4Info's full names), in one ReadRequest."""
        if tables is None:
            tables = [t.name for t in self.schema.tables]
        probes = [finsy.P4TableEntry(t) for t in tables]
        probes += [finsy.P4TableEntry(t, is_default_action=True) for t in tables]
        return [x for x in map(self.item, self._read(probes)) if x is not None]

    def read_replication(self) -> list:
        """Every multicast group and clone session, as Group and Clone (ports and
        instances as the switch has them; Group.node and Clone.group are not P4Runtime's
        and left out), in one ReadRequest."""
        return [self.item(ent) for ent in self._read([finsy.P4MulticastGroupEntry(), finsy.P4CloneSessionEntry()])]

    def item(self, ent):
        """A table entry, multicast group or clone session (a p4.v1.Entity) as an
        Entry, Group or Clone; None for a default action never set."""
        e = finsy.p4entity.decode_entity(ent, self.schema)
        if isinstance(e, finsy.P4TableEntry):
            table = self.schema.tables[e.table_id]
            if e.action is None:
                return None
            match = {table.match_fields[name].name: value for name, value in (e.match or {}).items()}
            return Entry(table=table.name, action=self.schema.actions[e.action.name].name,
                         params=dict(e.action.args), match=match, default=e.is_default_action)
        replicas = [(r, 0) if isinstance(r, int) else (r.port, r.instance) for r in e.replicas]
        if isinstance(e, finsy.P4MulticastGroupEntry):
            rids = {rid for _, rid in replicas}
            return Group(e.multicast_group_id, tuple(p for p, _ in replicas), rid=rids.pop() if len(rids) == 1 else -1)
        if isinstance(e, finsy.P4CloneSessionEntry):
            return Clone(e.session_id, tuple(p for p, _ in replicas))
        raise TypeError(f"not a table entry, multicast group or clone session: {e!r}")

    def parse_writes(self, text: str) -> list:
        """What WriteRequests in text format (as switch.p4rt.txt has them, each after a
        "# WriteRequest" line) write, as Entry, Group and Clone."""
        out = []
        for part in re.split(r"^# WriteRequest.*$", text, flags=re.M)[1:]:
            request = pbutil.from_text(part, p4r.WriteRequest)
            out += [self.item(u.entity) for u in request.updates]
        return out

    def counts(self) -> dict:
        out = {"messages": dict(self.messages), "updates": dict(self.updates),
               "read_entities": dict(self.read_entities)}
        if self.arbitration:
            out["arbitration"] = dict(self.arbitration)
        return out

"""Lab 9's client: watch a running switch over P4Runtime, then take it over and give
the client's port a deeper buffer half-way through the run, reading the queue's
occupancy register all along. (`incast lab starter 9 DIR`
writes it with the parts the student writes marked TODO (lab 9).)

    python3 p4rt_buffer.py --switch unix:/run/incast/TOKEN-s1.grpc --p4info P4INFO \\
        --after-bytes BYTES --limit 262144

A standard P4Runtime client (finsy's Switch): it knows the switch only by its address
and the program only by its P4Info, nothing of the testbed's own controller. It
watches as a backup (election id 1, below the testbed's 10: it may read, not write),
and once the client's port has sent --after-bytes it connects again bidding
--election-id: the highest bid makes it the primary, whose writes the switch
takes. It stays the primary until the run ends and its switch goes away. Meanwhile it
reads the queue's occupancy (the register occ_bytes) and says the most it saw before
and after the change.
"""
import argparse
import asyncio
import logging
import sys
from pathlib import Path

import finsy as fy

DROPS, SENT = "IncastIngress.drops", "IncastEgress.tx"       # per queue: index port * 8 + class
OCCUPANCY = "occ_bytes"     # register: the bytes each queue holds now
QUEUE_TABLES = ("IncastIngress.queue_config", "IncastEgress.egress_queue_config")
WATCH_ELECTION_ID = 1   # below the testbed's: a backup, whenever it connects
# P4Runtime has no counter or register notifications: a controller that watches them
# reads them again and again. Often enough to act within a block (a block lasts >= 200
# ms) and to see the queue near its fullest; the search (all 4096 queues) less often,
# to leave the CPU to the run.
POLL_S = 0.05
SLOW_POLL_S = 0.5


async def read_counter(sw, name, index=None) -> dict[int, tuple[int, int]]:
    """index -> (packets, bytes) of a counter: one cell, or the whole array (None)."""
    # lab 9 begin: one ReadRequest for the counter's cell (or all its cells):
    #   sw.read(fy.P4CounterEntry(...)) yields each cell, with .index, .packet_count and
    #   .byte_count.
    # lab 9 stub: raise NotImplementedError("TODO (lab 9): read_counter")
    return {e.index: (e.packet_count, e.byte_count) async for e in sw.read(fy.P4CounterEntry(name, index=index))}
    # lab 9 end


async def read_register(sw, name, index: int) -> int:
    """The value of one cell of a register."""
    # lab 9 begin: one ReadRequest for the register's cell: sw.read(fy.P4RegisterEntry(...))
    #   yields it, with .index and .data (the cell's value).
    # lab 9 stub: raise NotImplementedError("TODO (lab 9): read_register")
    (value,) = [e.data async for e in sw.read(fy.P4RegisterEntry(name, index=index))]
    return int(value)
    # lab 9 end


async def queue_entries(sw, q: int) -> list:
    """Queue q's entries in both queue tables (its settings: limit, xoff, xon)."""
    return [e for t in QUEUE_TABLES
            async for e in sw.read(fy.P4TableEntry(t, match=fy.P4TableMatch({"meta.qidx": q})))]


async def dropping_queue(sw) -> int:
    """The queue that drops: the client's port's, where the servers' bursts meet."""
    while True:
        try:
            dropped = {i: packets for i, (packets, _) in (await read_counter(sw, DROPS)).items() if packets}
        except fy.P4ClientError as e:
            if not e.is_pipeline_missing:
                raise
            dropped = {}        # started before the testbed gave the switch its program
        if dropped:
            return max(dropped, key=dropped.get)
        await asyncio.sleep(SLOW_POLL_S)


async def watch(sw, after_bytes: int) -> tuple[int, int]:
    """As a backup: (the client's queue, its drops) once it has sent after_bytes."""
    q = await dropping_queue(sw)
    print(f"queue {q} drops: port {q // 8}, class {q % 8}", flush=True)
    peak = 0
    while True:
        (drops, _), = (await read_counter(sw, DROPS, q)).values()
        (_, sent), = (await read_counter(sw, SENT, q)).values()
        peak = max(peak, await read_register(sw, OCCUPANCY, q))
        if sent >= after_bytes:
            print(f"queue {q}: {sent} bytes sent, {drops} packets dropped", flush=True)
            print(f"queue {q}: occupancy peak before the change: {peak} bytes", flush=True)
            return q, drops
        await asyncio.sleep(POLL_S)


async def change(sw, q: int, limit: int) -> None:
    """As the primary: queue q's limit, in both its entries (read, modify, write)."""
    entries = await queue_entries(sw, q)
    if len(entries) != len(QUEUE_TABLES):
        raise SystemExit(f"queue {q} has {len(entries)} queue_config entries, not {len(QUEUE_TABLES)}")
    old = entries[0].action.args["limit"]
    # lab 9 begin: write both entries back with the limit changed (sw.modify): the
    #   same table and match, the same action with its other parameters (xoff, xon) as
    #   they are. An entry read back has .table_id, .match, .action.name, .action.args.
    #   Then read them again and print the limit they now hold.
    # lab 9 stub: raise NotImplementedError(f"TODO (lab 9): change queue {q}'s limit ({old} bytes)")
    await sw.modify([fy.P4TableEntry(e.table_id, match=e.match, action=fy.P4TableAction(
        e.action.name, **{**e.action.args, "limit": limit})) for e in entries])
    print(f"queue {q}: limit {old} -> {[e.action.args['limit'] for e in await queue_entries(sw, q)]} bytes",
          flush=True)
    # lab 9 end


async def after_change(sw, q: int, drops: int) -> None:
    """Say how many more packets queue q drops after the change, and the most it holds,
    until the switch goes."""
    peak = 0
    while True:
        await asyncio.sleep(POLL_S)
        try:
            (now, _), = (await read_counter(sw, DROPS, q)).values()
            held = await read_register(sw, OCCUPANCY, q)
        except fy.P4ClientError:        # the switch is going: its channel goes down next
            return
        if now != drops:
            print(f"queue {q}: {now - drops} more packets dropped since the change", flush=True)
            drops = now
        if held > peak:
            peak = held
            print(f"queue {q}: occupancy peak after the change: {peak} bytes", flush=True)


def role(sw) -> str:
    return (f"election id {sw.election_id}: {'primary' if sw.is_primary else 'backup'} "
            f"(the primary's is {sw.primary_id})")


async def main(args) -> int:
    logging.getLogger("finsy").setLevel(logging.ERROR)    # not "gNMI is not implemented" (bmv2's)
    options = fy.SwitchOptions(p4info=args.p4info, device_id=args.device_id)
    async with fy.Switch("s1", args.switch, options(initial_election_id=WATCH_ELECTION_ID)) as sw:
        print(role(sw), flush=True)
        q, drops = await watch(sw, args.after_bytes)
    async with fy.Switch("s1", args.switch, options(initial_election_id=args.election_id)) as sw:
        print(role(sw), flush=True)
        if not sw.is_primary:
            print("not the primary: bid an election id above the testbed's", file=sys.stderr)
            return 1
        gone = sw.ee.event_future(fy.SwitchEvent.CHANNEL_DOWN)
        await change(sw, q, args.limit)
        # The primary until the run ends (the testbed's own controller reads on as a
        # backup): the switch ends with the run, and its channel with it.
        watcher = asyncio.ensure_future(after_change(sw, q, drops))
        await gone
        watcher.cancel()
        print("the switch is gone: the run has ended", flush=True)
    return 0


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--switch", required=True, help="the switch's P4Runtime address, e.g. unix:/run/incast/T-s1.grpc")
    p.add_argument("--p4info", type=Path, required=True, help="the program's P4Info (incast.p4info.txt)")
    p.add_argument("--device-id", type=int, default=0, help="the switch's P4Runtime device id (s1: 0)")
    # lab 9 begin: a bid that takes the switch over from the testbed's controller.
    # lab 9 stub: p.add_argument("--election-id", type=int, default=5, help="the bid that takes over")
    p.add_argument("--election-id", type=int, default=20, help="the bid that takes over (the testbed's is 10)")
    # lab 9 end
    p.add_argument("--after-bytes", type=int, required=True,
                   help="change the buffer once the client's port has sent this many bytes")
    p.add_argument("--limit", type=int, required=True, help="the client's port's new buffer, bytes")
    args = p.parse_args(argv)
    if args.limit <= 0 or args.after_bytes < 0 or args.election_id <= WATCH_ELECTION_ID:
        p.error(f"--limit must be positive, --after-bytes not negative, --election-id above {WATCH_ELECTION_ID}")
    if not args.p4info.is_file():
        p.error(f"--p4info: {args.p4info} is not a file")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))

"""Workload drivers: the memcached multiget runs end to end on real memcached servers,
the servers' TCP state is read from outside the process, and one shared server process
serves many hosts' namespaces."""
import json
import socket
import subprocess
import sys

import pytest

from conftest import REPO, needs_root, run_json
from incast import scenario as scn


def test_port_tcpinfo_reads_a_connection_of_another_process():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.sendall(b"x" * 100_000)
    got = 0
    while got < 100_000:
        got += len(client.recv(1 << 16))
    out = subprocess.run([sys.executable, str(REPO / "hosts" / "port_tcpinfo.py"), "--port", str(port)],
                         capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["peer"], r["peer_port"]) for r in rows] == [("127.0.0.1", client.getsockname()[1])]
    assert rows[0]["info"]["bytes_acked"] == 100_000
    for s in (client, conn, listener):
        s.close()


def test_memcached_refuses_qos_classes_it_cannot_mark():
    with pytest.raises(scn.ScenarioError, match="memcached workload"):
        scn.build({}, {"workload": "memcached", "qos_queues": "2"})
    s = scn.build({}, {"workload": "memcached", "senders": "4"})
    assert "memcached multiget SRU 256KiB" in s.describe()
    assert s.fragments() == [256 << 10] * 4


@needs_root
def test_memcached_multiget_runs_on_real_servers(tmp_path, no_leftovers):
    from incast.workload.memcached import VALUE_BYTES
    senders, sru, blocks, warmup = 4, 100_000, 6, 2
    s = run_json("--workload", "memcached", "--senders", senders, "--sru", sru, "--blocks", blocks,
                 "--warmup", warmup, "--link-rate", "100Mbit", "--out", tmp_path / "run")
    assert s["blocks"] == blocks and s["goodput_mbps"] > 0
    import pandas as pd
    flows = pd.read_parquet(tmp_path / "run" / "flows.parquet")
    assert sorted(flows["server"]) == [f"server{i}" for i in range(1, senders + 1)]
    sizes = [VALUE_BYTES] * (sru // VALUE_BYTES) + [sru % VALUE_BYTES]
    for i, row in enumerate(flows.sort_values("server").itertuples()):
        # memcached's answer to a multiget: VALUE <key> <flags> <bytes>, the value, ..., END
        answer = sum(len(f"VALUE incast:{i}:{k} 0 {n}\r\n") + n + 2 for k, n in enumerate(sizes)) + 5
        # every multiget answered whole, plus one STORED per key when the client stored them
        assert row.bytes_acked == (blocks + warmup) * answer + len(sizes) * len(b"STORED\r\n")
    table = pd.read_parquet(tmp_path / "run" / "blocks.parquet")
    assert (table["bytes"] == senders * sru).all()


@needs_root
def test_shared_server_serves_each_host_from_its_own_namespace():
    """One incast_server.py holding two hosts' listeners: each is reachable only inside
    its namespace, sends what is asked and reports its own connection's TCP state."""
    import concurrent.futures
    import struct
    import uuid
    from incast.machine.resources import setns
    names = [f"incast-shared-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    server = None
    try:
        for n in names:
            subprocess.run(["ip", "netns", "add", n], check=True)
            subprocess.run(["ip", "-n", n, "link", "set", "lo", "up"], check=True)
        server = subprocess.Popen([sys.executable, str(REPO / "hosts" / "incast_server.py"), "--port", "5001",
                                   "--netns", f"/run/netns/{names[0]}:8", "--netns", f"/run/netns/{names[1]}"],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "READY"

        def ask(size):
            c = socket.create_connection(("127.0.0.1", 5001), timeout=10)
            c.sendall(struct.pack("!Q", size))
            got = 0
            while got < size:
                got += len(c.recv(1 << 20))
            c.sendall(struct.pack("!Q", 0))
            length = struct.unpack("!I", c.recv(4, socket.MSG_WAITALL))[0]
            report = json.loads(c.recv(length, socket.MSG_WAITALL))
            c.close()
            return got, report
        sizes = (3_000_000, 5_000_000)
        for n, size in zip(names, sizes):
            with concurrent.futures.ThreadPoolExecutor(1, initializer=setns, initargs=(f"/run/netns/{n}",)) as pool:
                got, report = pool.submit(ask, size).result()
            assert got == size and report["bytes_acked"] >= size, (n, got, report.get("bytes_acked"))
        with pytest.raises(ConnectionRefusedError):   # nothing listens outside those namespaces
            socket.create_connection(("127.0.0.1", 5001), timeout=2)
        assert server.poll() is None
    finally:
        if server:
            server.kill()
            server.wait()
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


@needs_root
def test_shared_server_process_runs_the_incast_read(tmp_path, no_leftovers):
    senders, sru, blocks = 4, 64 * 1024, 5
    s = run_json("--senders", senders, "--sru", sru, "--blocks", blocks, "--link-rate", "100Mbit",
                 "--set", "workload.server_process=shared", "--out", tmp_path / "run")
    import pandas as pd
    flows = pd.read_parquet(tmp_path / "run" / "flows.parquet")
    assert sorted(flows["server"]) == [f"server{i}" for i in range(1, senders + 1)]
    assert (flows["bytes_acked"] >= (blocks + 2) * sru).all(), flows["bytes_acked"].tolist()
    assert s["blocks"] == blocks and s["goodput_mbps"] > 0

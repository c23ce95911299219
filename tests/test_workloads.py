"""Workload drivers: the memcached multiget runs end to end on real memcached servers,
and the servers' TCP state is read from outside the process."""
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

"""The CLI session a bmv2 switch keeps (bmv2.CliSession), against a stand-in that
talks as simple_switch_CLI does: a banner, then cmd.Cmd's prompt before each line it
reads. No bmv2 needed."""
import sys
import textwrap

import pytest

bmv2 = pytest.importorskip("incast.dataplane.bmv2")

FAKE_CLI = textwrap.dedent("""\
    import cmd, sys
    class Fake(cmd.Cmd):
        prompt = "RuntimeCmd: "
        def do_counter_read(self, line):
            name, index = line.split()
            print(f"{name}[{index}]=  ({int(index) * 100} bytes, {index} packets)")
        def do_register_read(self, line):
            name, index = line.split()
            print(f"{name}[{index}]= {int(index) * 7}")
        def do_crash(self, line):
            print("going away")
            sys.exit(3)
        def do_EOF(self, line):
            print()
            return True
    print("Obtaining JSON from switch...\\nDone\\nControl utility for runtime P4 table manipulation")
    Fake().cmdloop()
""")


@pytest.fixture
def session(tmp_path, monkeypatch):
    script = tmp_path / "simple_switch_CLI"
    script.write_text(f"#!{sys.executable}\n" + FAKE_CLI)
    script.chmod(0o755)
    monkeypatch.setattr(bmv2, "tool", lambda name: str(script))
    s = bmv2.CliSession("s9", 9099)
    yield s
    s.close()


def test_each_call_gets_the_answers_to_its_own_commands(session):
    out = session.run(["counter_read IncastEgress.tx 3", "register_read occ_bytes 2"])
    lines = [ln for ln in out.splitlines() if "=" in ln]
    assert [bmv2._parse_value(ln) for ln in lines] == [(3, 300), (14, 0)]
    assert "Obtaining JSON" not in out             # the banner went with the first prompt
    # The next call reads only its own answers, over the same process.
    pid = session.proc.pid
    again = session.run(["register_read occ_bytes 5", "", "counter_read IncastEgress.tx 1"])
    assert [bmv2._parse_value(ln) for ln in again.splitlines() if "=" in ln] == [(35, 0), (1, 100)]
    assert session.proc.pid == pid


def test_a_cli_that_exits_is_reported_with_what_it_said(session):
    with pytest.raises(RuntimeError, match=r"exit status 3.*going away"):
        session.run(["crash"])


def test_close_leaves_no_process(session):
    proc = session.proc
    session.close()
    assert proc.poll() == 0

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


def install_cli(tmp_path, monkeypatch, source: str) -> None:
    """The stand-in as the simple_switch_CLI that bmv2 runs."""
    script = tmp_path / "simple_switch_CLI"
    script.write_text(f"#!{sys.executable}\n" + source)
    script.chmod(0o755)
    monkeypatch.setattr(bmv2, "tool", lambda name: str(script))


@pytest.fixture
def session(tmp_path, monkeypatch):
    install_cli(tmp_path, monkeypatch, FAKE_CLI)
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


# A stand-in for a switch that bmv2 announced before it serves the simple_switch
# service: the first N sessions' clock query fails as bmv2's does then (the exception
# the CLI dies of), the later ones answer. N and the sessions started are in files.
WAKING_CLI = textwrap.dedent("""\
    import cmd, pathlib, sys
    state = pathlib.Path(sys.argv[0]).with_name("started")
    n = int(state.read_text()) if state.exists() else 0
    state.write_text(str(n + 1))
    failing = int(pathlib.Path(sys.argv[0]).with_name("failing").read_text())
    class Fake(cmd.Cmd):
        prompt = "RuntimeCmd: "
        def do_get_time_elapsed(self, line):
            if n < failing:
                print("Traceback (most recent call last):")
                print("thrift.Thrift.TApplicationException: TMultiplexedProcessor: Unknown service: "
                      "simple_switch. Did you forget to call registerProcessor()?")
                sys.exit(1)
            print("1234")
        def do_EOF(self, line):
            return True
    print("Control utility for runtime P4 table manipulation")
    Fake().cmdloop()
""")


@pytest.fixture
def waking(tmp_path, monkeypatch):
    install_cli(tmp_path, monkeypatch, WAKING_CLI)

    def start(failing: int):
        (tmp_path / "failing").write_text(str(failing))
        return lambda: int((tmp_path / "started").read_text())
    return start


def test_a_switch_not_yet_serving_its_service_is_asked_again_in_a_fresh_session(waking):
    started = waking(2)
    s = bmv2.serving_session("s9", 9099, alive=lambda: True)
    try:
        assert started() == 3                      # two sessions died of it, the third answers
        assert "1234" in s.run(["get_time_elapsed"])
    finally:
        s.close()


def test_a_switch_that_never_serves_it_fails_at_the_deadline_saying_why(waking):
    waking(10 ** 6)
    with pytest.raises(RuntimeError, match="Unknown service: simple_switch"):
        bmv2.serving_session("s9", 9099, alive=lambda: True, deadline_s=0.0)


def test_a_switch_that_died_is_not_waited_for(waking):
    started = waking(10 ** 6)
    with pytest.raises(RuntimeError, match="Unknown service"):
        bmv2.serving_session("s9", 9099, alive=lambda: False)
    assert started() == 1

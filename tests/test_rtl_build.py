"""The rtl data plane's model build (incast.dataplane.rtl.build_model) when runs side by
side need the same model at once: one build, the other run waits for it. A stand-in
make, no Verilator needed."""
import fcntl
import subprocess
import threading

from incast.dataplane import rtl


def test_runs_side_by_side_build_a_model_once(tmp_path, monkeypatch):
    monkeypatch.setattr(rtl, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(rtl.shutil, "which", lambda name: "/usr/bin/" + name)
    waiting = threading.Event()     # the second run has asked for the build lock
    real_flock, makes, results = fcntl.flock, [], {}

    def flock(f, op):
        if threading.current_thread().name == "second":
            waiting.set()
        return real_flock(f, op)

    def make(args, **kw):
        makes.append(args)
        # As the real recipe: the object directory begins afresh. The second run asks
        # for the model while this build is still going.
        out = next(a[4:] for a in args if a.startswith("OUT="))
        second = threading.Thread(target=lambda: results.setdefault("second", ask()), name="second")
        second.start()
        assert waiting.wait(10), "the second run did not wait for the build"
        (tmp_path / out).mkdir(parents=True, exist_ok=True)
        (tmp_path / out / "incast_switch_sim").write_text("model")
        results["thread"] = second
        return subprocess.CompletedProcess(args, 0, "", "")

    def ask():
        return rtl.build_model(16, 17)

    monkeypatch.setattr(rtl.fcntl, "flock", flock)
    monkeypatch.setattr(rtl.subprocess, "run", make)
    first = ask()
    results["thread"].join(60)
    assert len(makes) == 1, makes
    assert first == results["second"] == rtl.model_dir(16, 17) / "incast_switch_sim"

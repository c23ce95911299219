"""scripts/install-p4.sh's arguments, read without building anything: --dry-run prints
what the script would install, build and write, and stops before it checks for root.
As a guard, the script runs here with an `id` that says it is not root, so a --dry-run
that went on would stop at that check instead of installing."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts/install-p4.sh"


@pytest.fixture
def run(tmp_path):
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "id").write_text("#!/bin/sh\necho 65534\n")
    (fake / "id").chmod(0o755)

    def run(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
        return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                              env=env, timeout=60)
    return run


def plan(r: subprocess.CompletedProcess) -> dict[str, str]:
    assert r.returncode == 0, r.stderr
    return dict(line.split(": ", 1) for line in r.stdout.splitlines())


def test_help_names_the_grpc_option(run):
    r = run("--help")
    assert r.returncode == 0
    for option in ("--grpc", "--dry-run", "--prefix DIR", "--no-link"):
        assert option in r.stdout


def test_the_default_build_has_no_p4runtime(run):
    p = plan(run("--dry-run"))
    assert p["prefix"] == "/opt/p4"
    assert p["ld.so"] == "/etc/ld.so.conf.d/incast-p4.conf"
    assert p["python"] == "/usr/lib/python3/dist-packages/incast-p4.pth"
    assert p["build tree"] == "/var/tmp/incast-p4-build"
    assert p["programs"].split() == ["simple_switch", "p4c-bm2-ss"]
    assert p["link into /usr/local/bin"] == "yes"
    assert not any(k.startswith("PI") for k in p)
    assert "grpc" not in p["apt build"] + p["apt runtime"]
    assert "--with-pi" not in p["bmv2 1.15.5"]
    assert "PI" not in p["bmv2 make"].split() and "services" not in p["bmv2 make"].split()


@pytest.mark.parametrize("spelling", ["/opt/p4/", "/opt//p4", "/opt/p4/../p4"])
def test_the_default_prefix_however_written_keeps_its_files(run, spelling):
    p = plan(run("--prefix", spelling, "--dry-run"))
    assert p["prefix"] == "/opt/p4"
    assert p["ld.so"].endswith("/incast-p4.conf")


def test_another_prefix_writes_files_of_its_own(run):
    p = plan(run("--prefix", "/opt/p4-grpc", "--no-link", "--dry-run"))
    assert p["ld.so"] == "/etc/ld.so.conf.d/incast-p4_grpc.conf"
    assert p["python"] == "/usr/lib/python3/dist-packages/incast-p4_grpc.pth"
    assert p["build tree"] == "/var/tmp/incast-p4_grpc-build"
    assert p["link into /usr/local/bin"] == "no"
    # ld.so.conf.d and Python read their files sorted: the default prefix's come first
    names = ["incast-p4.conf", Path(p["ld.so"]).name]
    assert sorted(names) == names
    names = ["incast-p4.pth", Path(p["python"]).name]
    assert sorted(names) == names
    assert plan(run("--prefix", "/srv/p4", "--dry-run"))["ld.so"].endswith("/incast-p4_srv-p4.conf")


def test_grpc_adds_pi_and_simple_switch_grpc(run):
    p = plan(run("--grpc", "--prefix", "/opt/p4-grpc", "--jobs", "2", "--dry-run"))
    assert p["programs"].split() == ["simple_switch", "p4c-bm2-ss", "simple_switch_grpc"]
    assert p["jobs"] == "2"
    assert {"libgrpc++-dev", "libgrpc-dev", "protobuf-compiler-grpc"} <= set(p["apt build"].split())
    assert {"libgrpc++1.51", "libgrpc29"} <= set(p["apt runtime"].split())
    [pi] = [k for k in p if k.startswith("PI ")]
    assert re.fullmatch(r"PI [0-9a-f]{40}", pi)
    assert "--prefix=/opt/p4-grpc" in p[pi] and "--with-proto" in p[pi]
    # no Python stubs: they would shadow pip's packages through the .pth
    assert "ac_cv_path_GRPC_PY_PLUGIN= " in p[pi] + " "
    bmv2 = p["bmv2 1.15.5"]
    assert "--with-pi" in bmv2 and "--with-thrift" in bmv2
    assert "CPPFLAGS=-isystem /opt/p4-grpc/include" in bmv2 and "LDFLAGS=-L/opt/p4-grpc/lib" in bmv2
    make = p["bmv2 make"].split()
    assert make.index("PI") < make.index("targets/simple_switch") < make.index("targets/simple_switch_grpc")
    assert make.index("services") < make.index("targets/simple_switch_grpc")
    install = p["bmv2 install"].split()
    assert install.index("PI") < install.index("targets/simple_switch")
    assert "targets/simple_switch_grpc" in install
    for target in ("psa_switch", "pna_nic", "simple_router", "l2_switch"):
        assert f"targets/{target}" not in make


def make_src(root: Path, with_pi: bool = True, skip: str | None = None) -> Path:
    files = ["behavioral-model/configure.ac",
             "p4c/control-plane/p4runtime/proto/p4/v1/p4runtime.proto"]
    if with_pi:
        files += ["PI/proto/p4runtime/proto/p4/v1/p4runtime.proto",
                  "PI/proto/openconfig/gnmi/proto/gnmi/gnmi.proto",
                  "PI/third_party/uthash/src/uthash.h",
                  "PI/third_party/googletest/googletest/src/gtest.cc"]
    for f in files:
        if skip and f.startswith(f"PI/{skip}/"):
            continue
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).touch()
    return root


def test_src_must_hold_pi_and_its_submodules_with_grpc(run, tmp_path):
    src = make_src(tmp_path / "nopi", with_pi=False)
    assert plan(run("--src", str(src), "--dry-run"))["sources"] == str(src)
    r = run("--grpc", "--src", str(src), "--dry-run")
    assert r.returncode == 2 and "has no PI/" in r.stderr
    for sub in ("proto/p4runtime", "proto/openconfig/gnmi", "third_party/uthash",
                "third_party/googletest"):
        src = make_src(tmp_path / sub.replace("/", "-"), skip=sub)
        r = run("--grpc", "--src", str(src), "--dry-run")
        assert r.returncode == 2 and f"PI/{sub} is empty (PI's {sub} submodule)" in r.stderr, r.stderr
    src = make_src(tmp_path / "full")
    assert plan(run("--grpc", "--src", str(src), "--dry-run"))["sources"] == str(src)


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown argument --bogus"),
    (["--prefix"], "--prefix needs a value"),
    (["--grpc", "--jobs"], "--jobs needs a value"),
    (["--jobs", "two"], "--jobs takes a number of jobs, not two"),
    (["--from", "somewhere"], "--from auto, packages or source"),
])
def test_bad_arguments_stop_before_anything(run, args, message):
    r = run("--dry-run", *args)
    assert r.returncode == 2 and message in r.stderr and not r.stdout


def test_without_dry_run_it_wants_root(run):
    # (the fake id: this is the guard the tests above rely on)
    r = run("--grpc", "--prefix", "/nonexistent/p4")
    assert r.returncode == 2 and "run as root" in r.stderr

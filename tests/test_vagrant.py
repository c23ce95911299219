"""The Vagrant box: the Vagrantfile is valid, its providers share one provisioning, and
`vagrant up --provider=docker` from a clean checkout gives a working testbed (an
experiment and a lab's check run in it) that `vagrant destroy -f` removes without a
trace. Skipped, saying why, where vagrant or docker is absent.

The docker box keeps its slow parts in host caches outside the repository (see the
Vagrantfile): the base image incast/box-base:bookworm (made by
scripts/vagrant/base-image.sh, from Docker Hub or with debootstrap; kept, keyed by its
inputs), downloaded Debian packages (/var/cache/incast/box), the UML kernels (the
host's kernel cache, when it holds them) and bmv2/p4c (/opt/p4, when built there). With
them warm, up to destroy takes about 5 minutes on 2 cores."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO

VAGRANT = shutil.which("vagrant")
DOCKER = shutil.which("docker")
BASE_IMAGE = "incast/box-base:bookworm"


@pytest.mark.skipif(VAGRANT is None, reason="vagrant is not installed (apt-get install vagrant)")
def test_vagrantfile_validates():
    # (the providers' own blocks: where their tools are usable; the docker one below)
    r = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated successfully" in r.stdout


def test_every_provider_shares_the_projects_provisioning():
    text = (REPO / "Vagrantfile").read_text()
    for provider in ("virtualbox", "libvirt", "docker"):
        assert f'config.vm.provider "{provider}"' in text
    # one provisioning, outside the provider blocks: setup, then P4, then the kernels
    order = [text.index(s) for s in ("./scripts/setup.sh", "./scripts/install-p4.sh",
                                     "./scripts/vagrant/kernels.sh", '"incast lab list"')]
    assert order == sorted(order)
    # no package repository of its own: P4 comes from the script that can also build it
    assert "download.opensuse.org" not in text


def test_the_p4_script_pins_releases_the_project_accepts():
    from incast.dataplane.bmv2 import MIN_VERSION
    script = (REPO / "scripts/install-p4.sh").read_text()
    pins = dict(re.findall(r"^(BMV2_MIN|BMV2_TAG|P4C_MIN|P4C_TAG)=v?([0-9.]+)$", script, re.M))
    version = lambda s: tuple(int(x) for x in s.split("."))   # noqa: E731
    assert version(pins["BMV2_MIN"]) >= MIN_VERSION
    assert version(pins["BMV2_TAG"]) >= version(pins["BMV2_MIN"])
    assert version(pins["P4C_TAG"]) >= version(pins["P4C_MIN"])
    r = subprocess.run(["bash", str(REPO / "scripts/install-p4.sh"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--src DIR" in r.stdout


# --- vagrant up --provider=docker, for real ------------------------------------------

def docker(*args, check=True, timeout=120) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode:
        raise AssertionError(f"docker {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def docker_ready() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture
def docker_daemon(tmp_path_factory):
    """A Docker daemon: the running one, or one started here (and stopped at the end).
    One started here has no bridge and does not touch the host's iptables: the box
    uses the host's network, for its build too."""
    if docker_ready():
        yield None
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.skip("no Docker daemon runs and dockerd is not installed (apt-get install docker.io)")
    log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([dockerd, "--iptables=false", "--ip-masq=false", "--bridge=none"],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline and not docker_ready():
            time.sleep(0.5)
        if not docker_ready():
            pytest.skip(f"dockerd does not start here: {log.read_text()[-500:]}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def clean_checkout(dest: Path) -> Path:
    """The repository's files as a clean checkout has them (tracked and new ones, none
    that .gitignore names: no results, builds or .vagrant)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / os.fsdecode(name)
        if src.is_file():
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_nsfs_mounts() -> set[str]:
    """Namespace files mounted in the host's mount namespace outside /run/netns (a box's
    namespace would show here if one leaked; /run/netns holds the host's own runs',
    which the box, with a /run of its own, cannot reach)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return {ln.split()[4] for ln in lines if " - nsfs " in ln and not ln.split()[4].startswith("/run/netns/")}


def pids_in_cgroup_of(container_id: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if container_id in (p / "cgroup").read_text():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def uml_kernels_restorable() -> bool:
    """The host's kernel cache holds the UML kernels a box would look for: built for the
    current inputs, and for the linux-source-6.12 a box installs (Debian's newest: the
    host's, unless the archive has a newer one the host has not installed)."""
    r = subprocess.run(["bash", str(REPO / "kernels/build.sh"), "--uml", "--print-dir"],
                       capture_output=True, text=True)
    policy = subprocess.run(["apt-cache", "policy", "linux-source-6.12"], capture_output=True, text=True).stdout
    versions = dict(re.findall(r"^\s*(Installed|Candidate): (\S+)", policy, re.M))
    return r.returncode == 0 and versions.get("Installed") == versions.get("Candidate")


def p4_prefix_built() -> bool:
    return all(os.access(f"/opt/p4/bin/{t}", os.X_OK) for t in ("simple_switch", "p4c-bm2-ss"))


@pytest.mark.network
@pytest.mark.skipif(VAGRANT is None, reason="vagrant is not installed (apt-get install vagrant)")
@pytest.mark.skipif(DOCKER is None, reason="docker is not installed (apt-get install docker.io)")
@pytest.mark.skipif(os.geteuid() != 0, reason="the docker box needs root here (Docker, debootstrap)")
def test_vagrant_up_docker_runs_an_experiment_and_a_lab_then_leaves_nothing(docker_daemon, tmp_path):
    t0 = time.monotonic()
    checkout = clean_checkout(tmp_path / "checkout")
    uml, p4 = uml_kernels_restorable(), p4_prefix_built()
    env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1", "VAGRANT_NO_COLOR": "1",
           "INCAST_BOX_SSH_PORT": str(free_port()),
           # a box restores the host's UML kernels and bmv2/p4c, or goes without them:
           # building them would take an hour
           "INCAST_BOX_KERNELS": "auto" if uml else "skip", "INCAST_BOX_P4": "auto" if p4 else "skip"}
    base_before = docker("images", "-q", BASE_IMAGE).strip()
    images_before = set(docker("images", "-aq", "--no-trunc").split())
    containers_before = set(docker("ps", "-aq", "--no-trunc").split())
    nsfs_before = host_nsfs_mounts()
    log = []

    def vagrant(*args, timeout=900) -> subprocess.CompletedProcess:
        r = subprocess.run(["vagrant", *args], cwd=checkout, env=env, capture_output=True, text=True,
                           timeout=timeout)
        log.append(f"$ vagrant {' '.join(args)}  ({r.returncode})\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        return r

    def ssh(command: str, timeout=600) -> subprocess.CompletedProcess:
        return vagrant("ssh", "-c", command, timeout=timeout)

    container = None
    try:
        r = vagrant("up", "--provider=docker")
        id_file = checkout / ".vagrant/machines/default/docker/id"
        container = id_file.read_text().strip() if id_file.is_file() else None
        assert r.returncode == 0, "\n".join(log)
        t_up = time.monotonic() - t0
        if uml:
            assert "kernels: virtual time works" in r.stdout, r.stdout[-3000:]

        # every lab is there; with bmv2 and p4c, every lab can run
        r = ssh("incast lab list")
        assert r.returncode == 0, "\n".join(log)
        listed = [ln for ln in r.stdout.splitlines() if re.match(r"\s*[1-7]\s", ln)]
        assert len(listed) == 7, r.stdout
        needing = [ln for ln in listed if "needs:" in ln]
        assert needing == ([] if p4 else listed[4:]), r.stdout

        # an experiment
        r = ssh("cd /tmp && sudo incast run --senders 4 --link-rate 100Mbit --blocks 5 --json --out /tmp/run4")
        assert r.returncode == 0, "\n".join(log)
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        assert summary["senders"] == 4 and summary["goodput_mbps"] > 0, summary

        # virtual time: the same experiment in a UML guest
        if uml:
            r = ssh("cd /tmp && sudo incast run --clock virtual --kernel hrtimer --senders 4 --link-rate 100Mbit"
                    " --blocks 5 --json --out /tmp/vt4")
            assert r.returncode == 0, "\n".join(log)
            assert json.loads(r.stdout.strip().splitlines()[-1])["goodput_mbps"] > 0, r.stdout

        # a lab, checked with its reference answers
        r = ssh("cd /vagrant && sudo /opt/incast/venv/bin/python labs/01-see-incast/solution/solve.py /tmp/lab1"
                " && sudo incast lab check 1 /tmp/lab1/answers.toml")
        assert r.returncode == 0 and "every answer checks out" in r.stdout, "\n".join(log)
        if p4:
            r = ssh("cd /vagrant && sudo /opt/incast/venv/bin/python labs/05-p4-shallow-buffer/solution/solve.py"
                    " /tmp/lab5 && sudo incast lab check 5 /tmp/lab5/answers.toml")
            assert r.returncode == 0 and "every answer checks out" in r.stdout, "\n".join(log)

        # the runs cleaned up after themselves in the box
        r = ssh("sudo ip netns list; sudo ls /run/incast 2>/dev/null; pgrep -a 'simple_switch|memcached|linux' || true")
        assert r.returncode == 0 and r.stdout.strip() == "", "\n".join(log)
    finally:
        built = checkout / ".vagrant/machines/default/docker/docker_build_image"
        built = built.read_text().strip() if built.is_file() else None
        r = vagrant("destroy", "-f", timeout=300)
        # so that a failed destroy leaves nothing either
        if container and container in docker("ps", "-aq", "--no-trunc", check=False):
            docker("rm", "-f", container, check=False)
        if built and docker("images", "-q", built, check=False).strip():
            docker("rmi", built, check=False)
    t_all = time.monotonic() - t0
    print(f"vagrant up {t_up:.0f} s, up to destroy {t_all:.0f} s (UML kernels {uml}, P4 {p4})")
    assert r.returncode == 0, "\n".join(log)

    assert set(docker("ps", "-aq", "--no-trunc").split()) == containers_before
    # no image of ours but the base image, a cache kept on purpose
    left = set(docker("images", "-aq", "--no-trunc").split()) - images_before
    base = docker("images", "-q", "--no-trunc", BASE_IMAGE).strip()
    assert left <= {base}, f"images left behind: {left - {base}}"
    assert base_before == "" or base, "the base image went"
    assert host_nsfs_mounts() <= nsfs_before, f"namespaces left behind: {host_nsfs_mounts() - nsfs_before}"
    assert container is not None and pids_in_cgroup_of(container) == [], "processes of the box left behind"

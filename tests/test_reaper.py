"""runtime/reaper.py: when the owner of an embedded Ray cluster dies, every process that
names the cluster's folder ends and the folder goes; nothing else is touched."""

import os
import subprocess
import sys
import time

from processes import alive

HOLDER = ("import sys, time; f = open(sys.argv[1] + '/log', 'a'); print('ready', flush=True); "
          "time.sleep(300)")


def start(*args, **kwargs):
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)


def test_the_reaper_ends_the_dead_owners_cluster_and_nothing_else(tmp_path):
    cluster, other = tmp_path / "rlray-test", tmp_path / "rlray-other"
    cluster.mkdir()
    other.mkdir()
    # Two "cluster processes": one holds a file open in the folder (as Ray's renamed agents
    # do), one runs inside it; a bystander holds a file in another folder.
    member = start("-c", HOLDER, str(cluster))
    inside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                              cwd=cluster, start_new_session=True)
    bystander = start("-c", HOLDER, str(other))
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    reaper = None
    try:
        assert member.stdout.readline().strip() == "ready"
        assert bystander.stdout.readline().strip() == "ready"
        reaper = subprocess.Popen([sys.executable, "-m", "rlscale.runtime.reaper",
                                   str(owner.pid), str(cluster)], start_new_session=True)
        time.sleep(1.0)
        assert alive(member.pid) and alive(inside.pid), "the reaper acted while its owner lived"
        owner.kill()
        owner.wait()
        reaper.wait(timeout=20)
        for proc in (member, inside):
            proc.wait(timeout=10)
        assert not cluster.exists()
        assert alive(bystander.pid) and other.is_dir()
    finally:
        for proc in (member, inside, bystander, owner, reaper):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_reaper_leaves_when_the_cluster_shuts_down_normally(tmp_path):
    folder = tmp_path / "rlray-normal"
    folder.mkdir()
    reaper = subprocess.Popen([sys.executable, "-m", "rlscale.runtime.reaper", str(os.getpid()),
                               str(folder)], start_new_session=True)
    try:
        time.sleep(0.6)
        assert reaper.poll() is None
        folder.rmdir()
        assert reaper.wait(timeout=10) == 0
    finally:
        if reaper.poll() is None:
            reaper.kill()
            reaper.wait()

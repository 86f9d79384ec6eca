"""--cpus: CPU lists, pinning every thread of the probe's process, and the client's CPU set
against the machine's (client_health.client_cpu)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.probe.affinity import parse_cpu_list, worker_cpus
from collectors.probe.health import HealthMonitor, HealthSamples, client_cpu, server_is_local

ROOT = Path(__file__).resolve().parents[3]
linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")


def test_cpu_lists_parse_and_bad_ones_say_why():
    assert parse_cpu_list("3") == (3,)
    assert parse_cpu_list("0, 2-3,2") == (0, 2, 3)
    for bad, why in (("x", "not a CPU number"), ("3-1", "bad range"), (",", "no CPU"), ("-1", "not a CPU")):
        with pytest.raises(ValueError, match=why):
            parse_cpu_list(bad)
    assert worker_cpus((4, 5), 0, 2) == (4,) and worker_cpus((4, 5), 1, 2) == (5,)
    assert worker_cpus((4,), 1, 2) == (4,) and worker_cpus(None, 0, 2) is None


@pytest.mark.parametrize("value, msg", [("x", "not a CPU number"), ("100000", "not available to this process")])
def test_cli_rejects_a_bad_cpu_list_in_one_line(server, capsys, value, msg):
    from diag.cli import main

    if msg.startswith("not available") and not hasattr(os, "sched_setaffinity"):
        msg = "needs Linux"
    assert main(["probe", server.url("ok"), "--no-capture", "--cpus", value]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1


@linux_only
def test_pinning_moves_threads_already_running_and_new_ones():
    cpu = min(os.sched_getaffinity(0))
    code = (
        "import os, threading, time\n"
        "from collectors.probe.affinity import pin_process\n"
        "ev = threading.Event(); seen = {}\n"
        "def early():\n"
        "    seen['early_tid'] = threading.get_native_id(); ev.wait()\n"
        "t = threading.Thread(target=early); t.start(); time.sleep(0.05)\n"
        f"pin_process(({cpu},))\n"
        "seen['early'] = sorted(os.sched_getaffinity(seen['early_tid']))\n"
        "late = threading.Thread(target=lambda: seen.__setitem__('late', sorted(os.sched_getaffinity(0))))\n"
        "late.start(); late.join(); ev.set(); t.join()\n"
        "print(seen['early'], seen['late'], sorted(os.sched_getaffinity(0)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"[{cpu}]"] * 3


@linux_only
def test_probe_pinned_records_the_mask_and_its_cpu_per_chunk(server, tmp_path):
    cpu = min(os.sched_getaffinity(0))
    cap = tmp_path / "cap"
    out = subprocess.run([sys.executable, "-m", "diag", "probe", server.url("ok"), "--api", "chat", "-c", "2",
                          "-n", "6", "--warmup", "0", "--output-tokens", "4", "--cpus", str(cpu), "-o", str(cap),
                          "--json", "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    meta = json.loads((cap / "meta.json").read_text())
    assert meta["probe"]["cpus"] == [cpu]
    c = meta["client_health"]["client_cpu"]
    assert c["pinned_cpus"] == [cpu] and c["server_local"] is True
    assert c["cpu_s"] > 0 and c["cpu_us_per_chunk"] > 0 and c["cpu_ms_per_request"] > 0
    assert json.loads(out.stdout)["client_health"]["client_cpu"]["cpu_s"] == c["cpu_s"]


def test_monitor_totals_its_threads_cpu_and_the_machines():
    async def go():
        mon = HealthMonitor(interval_s=0.02)
        mon.start()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.2:
            pass
        return await mon.stop()

    s = asyncio.run(go())
    assert s.cpu_s > 0.05 and s.wall_s >= 0.2
    if Path("/proc/stat").exists():
        assert s.machine_total_s > 0 and s.machine_busy_s > 0
    again = HealthSamples.from_dict(json.loads(json.dumps(s.to_dict())))
    assert (again.cpu_s, again.machine_busy_s) == (s.cpu_s, s.machine_busy_s)


def _samples(cpu_s, busy_s, total_s):
    return [HealthSamples("", [1.0], [0.0], [0.0], cpu_s=cpu_s, wall_s=10.0, machine_busy_s=busy_s,
                          machine_total_s=total_s)]


def test_client_cpu_says_when_it_took_cpu_a_local_server_needed():
    # 2 CPUs for 10 s: 20 CPU s; the machine 19 s busy, the client 3 s of it (15 %)
    took = client_cpu(_samples(3.0, 19.0, 20.0), requests=100, chunks=3000, server_local=True)
    assert took["took_server_cpu"] is True and took["cpu_us_per_chunk"] == pytest.approx(1000.0)
    assert "--cpus" in took["note"] and "15%" in took["note"]
    pinned = client_cpu(_samples(3.0, 19.0, 20.0), requests=100, chunks=3000, server_local=True, pinned=(1,))
    assert pinned["took_server_cpu"] is True and "pinned to CPU(s) 1" in pinned["note"]
    # the server elsewhere, spare CPU on the machine, or a client that barely used any: nothing to say
    assert client_cpu(_samples(3.0, 19.0, 20.0), server_local=False)["took_server_cpu"] is False
    assert client_cpu(_samples(3.0, 12.0, 20.0), server_local=True)["took_server_cpu"] is False
    assert client_cpu(_samples(0.5, 19.5, 20.0), server_local=True)["note"] is None


def test_which_servers_share_the_machine():
    assert server_is_local("http://127.0.0.1:8000") and server_is_local("http://localhost:1/v1")
    assert server_is_local("http://[::1]:8000")
    assert not server_is_local("http://10.1.2.3:8000") and not server_is_local(None)

"""The broker's glibc malloc settings: request-sized buffers freed and allocated again land
on pages already mapped (counted as minor page faults of a real process)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc only")

_PROGRAM = """
import resource, sys, threading
if sys.argv[1] == "set":
    from fluvial.broker.malloc_settings import keep_freed_memory
    assert keep_freed_memory()

def cycles(n):
    # Eight 1 MB buffers at once, as a busy produce path holds frames and value buffers.
    for _ in range(n):
        held = [bytearray(1 << 20) for _ in range(8)]
        del held

def faults_per_cycle():
    cycles(5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cycles(40)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 40

result = []
worker = threading.Thread(target=lambda: result.append(faults_per_cycle()))  # another arena
worker.start()
worker.join()
print(faults_per_cycle(), result[0])
"""


def _faults(mode: str) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _PROGRAM, mode], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    main, thread = map(float, out.stdout.split())
    return main, thread


def test_freed_request_sized_buffers_are_reused_without_page_faults():
    default_main, default_thread = _faults("default")
    kept_main, kept_thread = _faults("set")
    # 8 MB a cycle is 2,048 pages: glibc's defaults give most of them back and fault them in
    # again; with the broker's settings they stay mapped.
    assert default_main > 1000 and default_thread > 1000
    assert kept_main < 50 and kept_thread < 50


def test_settings_in_the_environment_are_left_alone():
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="1000000")
    out = subprocess.run([sys.executable, "-c",
                          "from fluvial.broker.malloc_settings import keep_freed_memory; print(keep_freed_memory())"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"

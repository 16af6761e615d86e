"""The C units' own tests (tests/c/test_<unit>.c), built with gcc under
AddressSanitizer and UBSan, and the ring and doorbell under ThreadSanitizer
too (their two-sided cases then run as threads, which it can see).

FASTLOAD_C_STRESS sets the messages of the ring's stress runs: 300000 by
default, to keep the suite quick; FASTLOAD_C_STRESS=10000000 for the full
run (about a minute under ASan)."""
import os
import pathlib
import platform
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "fastload_c" / "src"
TESTS_C = ROOT / "tests" / "c"
# Each unit's test and the C sources it links (the doorbell is header-only).
UNITS = {"ring": ["fl_ring.c"], "doorbell": [], "slab": ["fl_slab.c"], "copy": ["fl_copy.c"],
         "shm": ["fl_shm.c"], "proc": ["fl_proc.c"], "ragged": ["fl_ragged.c"]}
SANITIZERS = {
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "tsan": ["-fsanitize=thread"],
}
CASES = [(unit, "asan") for unit in UNITS] + [("ring", "tsan"), ("doorbell", "tsan")]
CC = shutil.which(os.environ.get("CC", "gcc"))


def _build(unit, sanitizer, exe):
    command = [CC, "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter",
               "-Werror", *SANITIZERS[sanitizer], f"-I{SRC}", f"-I{TESTS_C}",
               str(TESTS_C / f"test_{unit}.c"), *(str(SRC / c) for c in UNITS[unit]),
               "-o", str(exe), "-pthread"]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0 and "san" in built.stderr and "cannot find" in built.stderr:
        pytest.skip(f"{CC} has no {sanitizer} runtime: {built.stderr.strip()}")
    assert built.returncode == 0, built.stderr


def _run(exe):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
               TSAN_OPTIONS="halt_on_error=1")
    ran = subprocess.run([str(exe)], capture_output=True, text=True, env=env)
    if "unexpected memory mapping" in ran.stderr:
        # ThreadSanitizer of older compilers cannot place its shadow memory
        # under the randomized layout of newer kernels: run without it.
        ran = subprocess.run(["setarch", platform.machine(), "-R", str(exe)],
                             capture_output=True, text=True, env=env)
    return ran


@pytest.mark.timeout(600)
@pytest.mark.parametrize("unit,sanitizer", CASES)
def test_c_unit(unit, sanitizer, tmp_path):
    if CC is None:
        pytest.skip("no C compiler (gcc, or $CC) on PATH to build the C unit tests")
    exe = tmp_path / f"test_{unit}_{sanitizer}"
    _build(unit, sanitizer, exe)
    ran = _run(exe)
    assert (ran.returncode, ran.stdout) == (0, "ok\n"), ran.stdout + ran.stderr


def test_every_c_unit_has_a_test():
    units = {p.stem.removeprefix("fl_") for p in SRC.glob("fl_*.[ch]")} - {"futex"}
    assert units == set(UNITS)
    assert {p.stem.removeprefix("test_") for p in TESTS_C.glob("test_*.c")} == set(UNITS)

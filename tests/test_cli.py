"""The command line as a whole: one meaning per flag, errors printed once under mpiexec, a
failure on one rank ends the job, a closed pipe ends quietly, no progress bars into pipes."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import MPIEXEC, ROOT, mpirun

#: short flag -> the long flags it may stand for, in every subcommand but train
CONVENTION = {
    "-a": {"--algorithms", "--algorithm"}, "-p": {"--ranks"}, "-s": {"--sizes", "--size"},
    "-d": {"--dtype"}, "-o": {"--op"}, "-n": {"--iters"}, "-w": {"--warmup"},
    "-r": {"--rounds"}, "-b": {"--min-bytes"}, "-e": {"--max-bytes"}, "-f": {"--factor"},
    "-c": {"--check"}, "-h": {"--help"},
}
RETIRED = {"--out", "--bytes", "--dtypes", "--ops", "--algorithm-options"}


def _subparsers():
    import argparse

    from mlcomm.cli import _parser
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: p for name, p in action.choices.items() if name != "train"}


def test_one_meaning_per_flag():
    subs = _subparsers()
    assert set(subs) == {"info", "verify", "bench", "tune", "analyze", "simulate", "explain",
                         "draw", "calibrate"}
    for name, parser in subs.items():
        for action in parser._actions:
            shorts = [s for s in action.option_strings if not s.startswith("--")]
            longs = {s for s in action.option_strings if s.startswith("--")}
            assert not longs & RETIRED, (name, longs)
            for short in shorts:
                assert short in CONVENTION and longs <= CONVENTION[short], (name, short, longs)
            if "--option" in longs:
                assert not shorts and action.option_strings == ["--option"], name
            if "--format" in longs:
                assert set(action.choices) == {"table", "csv", "json"}, name
            if "--progress" in longs:
                assert action.option_strings == ["--progress", "--no-progress"], name
    sizes = {name for name, p in subs.items()
             if any("--sizes" in a.option_strings or "--size" in a.option_strings
                    for a in p._actions)}
    assert {"bench", "tune", "analyze", "simulate", "explain", "draw"} <= sizes


# ----------------------------------------------------------------- mlcomm info

def test_info_lists_every_variable_with_its_value_or_default():
    from mlcomm.config import VARIABLES
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLCOMM_")}
    env.update(MLCOMM_STALL_SECONDS="7.5", MLCOMM_AUTO="model")
    proc = subprocess.run([sys.executable, "-m", "mlcomm", "info"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = lines.index("variables   the value set, else [the default]")
    rows = {line.split()[0]: line for line in lines[start + 1:]}
    assert list(rows) == list(VARIABLES)
    for name, var in VARIABLES.items():
        shown = {"MLCOMM_STALL_SECONDS": "7.5", "MLCOMM_AUTO": "model"}.get(
            name, f"[{var.default}]")
        assert rows[name].split(None, 1)[1].startswith(shown + " "), rows[name]
        assert rows[name].endswith("  " + var.what), rows[name]


def test_the_variable_table_names_every_variable_read_and_their_defaults():
    """Every MLCOMM_* name in mlcomm/ and kernels/ is in the table, and the table's
    defaults are the ones the code applies."""
    import re

    from mlcomm import config, session
    from mlcomm.algorithms.shared_memory import DEFAULT_SLOT_BYTES
    from mlcomm.buffers.staging import CHUNK_BYTES
    from mlcomm.kernels import dispatch
    read = {m for folder in ("mlcomm", "kernels") for path in (ROOT / folder).rglob("*.py")
            for m in re.findall(r"\bMLCOMM_[A-Z_]*[A-Z]\b", path.read_text())}
    assert read == set(config.VARIABLES)
    default = {name: var.default for name, var in config.VARIABLES.items()}
    assert default["MLCOMM_CACHE_BYTES"] == str(session.CACHE_BYTES)
    assert default["MLCOMM_SHM_BYTES"] == str(DEFAULT_SLOT_BYTES)
    assert default["MLCOMM_STAGING_CHUNK_BYTES"] == str(CHUNK_BYTES)
    assert "MLCOMM_NUMBA_MIN_BYTES" in os.environ or \
        default["MLCOMM_NUMBA_MIN_BYTES"] == str(dispatch.NUMBA_MIN_BYTES)
    assert "MLCOMM_STALL_SECONDS" in os.environ or \
        float(default["MLCOMM_STALL_SECONDS"]) == config.stall_seconds()
    assert default["MLCOMM_EXECUTOR"] == config.executor() or "MLCOMM_EXECUTOR" in os.environ
    assert default["MLCOMM_AUTO"] == config.auto_mode() or "MLCOMM_AUTO" in os.environ


# ----------------------------------------------------------------- a closed pipe

def _closed_pipe(*argv):
    """Run ``python -m mlcomm ARGV`` with its stdout a pipe nobody reads."""
    proc = subprocess.Popen([sys.executable, "-m", "mlcomm", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode()
        return proc.wait(timeout=120), err
    finally:
        proc.kill()


@pytest.mark.parametrize("argv", [["info"], ["analyze", "-p", "4,8", "-s", "8,1M"]])
def test_a_closed_pipe_ends_quietly(argv):
    status, err = _closed_pipe(*argv)
    assert status == 141 and err == "", err


def test_head_takes_the_first_lines_quietly():
    cmd = (f"{sys.executable} -m mlcomm analyze -p 8 -s 1M | head -2; "
           f"echo status ${{PIPESTATUS[0]}}")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# p = 8 ranks") and lines[1].startswith("algorithm")
    assert lines[2] in ("status 0", "status 141") and proc.stderr == ""


# ----------------------------------------------------------------- progress bars

def test_progress_bars_only_on_a_terminal_or_when_asked():
    argv = [sys.executable, "-m", "mlcomm", "simulate", "-p", "2,4,8,16", "-s", "8,64",
            "-a", "ring,rd", "--format", "csv"]
    quiet = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert quiet.returncode == 0 and quiet.stderr == ""
    asked = subprocess.run(argv + ["--progress"], capture_output=True, text=True, timeout=120,
                           cwd=ROOT)
    assert asked.returncode == 0 and "simulate" in asked.stderr
    assert asked.stdout == quiet.stdout


# ----------------------------------------------------------------- under mpiexec

def test_an_argument_error_is_printed_once_and_every_rank_exits():
    proc = mpirun(3, ["-m", "mlcomm", "bench", "--quick", "--bogus"], timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("usage: mlcomm") == 1
    assert proc.stderr.count("unrecognized arguments: --bogus") == 1


def test_help_is_printed_once():
    proc = mpirun(3, ["-m", "mlcomm", "verify", "--help"], timeout=60)
    assert proc.stdout.count("usage: mlcomm verify") == 1 and proc.stderr == ""


def test_the_console_script_and_a_bench_script_print_errors_once():
    script = shutil.which("mlcomm", path=str(ROOT / ".venv" / "bin")) or shutil.which("mlcomm")
    for argv in ([script, "tune", "-b", "64K", "-e", "8"],
                 [ROOT / "bench" / "memory.py", "--worker", "--bogus"]):
        proc = mpirun(2, argv, timeout=60, check=False)
        assert proc.returncode == 2 and proc.stderr.count("usage:") == 1, proc.stderr


def _mpmd(*parts, timeout=60):
    """``mpiexec -n 1 python A : -n 1 python B ...``: one command line per rank."""
    cmd = [MPIEXEC]
    for i, argv in enumerate(parts):
        cmd += ([":"] if i else []) + ["-n", "1", sys.executable, *map(str, argv)]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} hung for {timeout}s\n{exc.stdout}\n{exc.stderr}")


def test_a_flag_that_one_rank_alone_sees_ends_the_job():
    ok = ["-m", "mlcomm", "bench", "--quick", "-a", "ring"]
    proc = _mpmd(ok, ok + ["--bogus"], ok)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("unrecognized arguments: --bogus") == 1
    assert "rank 1 was given a different command line from rank(s) [0, 2]" in proc.stderr


def test_a_system_exit_on_one_rank_after_parsing_ends_the_job():
    """Rank 0 alone asks for --device cuda and has no CuPy: its message, then the abort."""
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: --device cuda does not fail here")
    except ImportError:
        pass
    base = ["-m", "mlcomm", "bench", "--no-progress", "-a", "ring", "-s", "8"]
    proc = _mpmd(base + ["--device", "cuda"], base, base)
    assert proc.returncode != 0
    assert "--device cuda needs CuPy" in proc.stdout + proc.stderr


_ONE_RANK = """
import sys
from mpi4py import MPI
from mlcomm.cli import abort_on_error

def main():
    if MPI.COMM_WORLD.Get_rank() == 1:
        {failure}
    MPI.COMM_WORLD.Barrier()      # the other ranks wait here for rank 1
    return 0

sys.exit(abort_on_error(main))
"""


@pytest.mark.parametrize("failure, words", [
    ("raise SystemExit('rank 1 cannot go on: no such file')", "rank 1 cannot go on"),
    ("raise SystemExit(3)", "rank 1 exited with status 3"),
    ("raise RuntimeError('rank 1 broke')", "RuntimeError: rank 1 broke"),
])
def test_a_failure_on_one_rank_aborts_the_job(tmp_path, failure, words):
    script = tmp_path / "one_rank.py"
    script.write_text(_ONE_RANK.format(failure=failure))
    proc = mpirun(3, [script], timeout=60, check=False)
    assert proc.returncode != 0 and words in proc.stdout + proc.stderr, proc.stderr


def test_a_clean_exit_passes_through():
    from mlcomm.cli import abort_on_error
    for code in (0, None):
        with pytest.raises(SystemExit) as exc:
            abort_on_error(lambda: sys.exit(code))
        assert exc.value.code == code

"""``mlcomm verify`` cannot lie: one wrong rank fails every rank, bad names are errors,
a row without cases is a SKIP, dtype, shape and the input buffer are checked."""

import re

import numpy as np
import pytest

from mlcomm import verify as v

from conftest import mpirun

VERIFY = ["-m", "mlcomm", "verify"]


# ----------------------------------------------------------------- no MPI job

def _case(x, got, op="sum", p=2, in_place=False, before=None):
    want = x.astype(np.float64) * p if x.dtype.kind == "f" else x * p
    return v._problem(got, x, x.copy() if before is None else before, want, p, op, in_place)


def test_a_right_answer_has_no_problem():
    x = np.arange(6, dtype=np.int32)
    assert _case(x, x * 2) == ""


@pytest.mark.parametrize("got, words", [
    (np.arange(6, dtype=np.int64) * 2, "result dtype int64, input int32"),
    ((np.arange(6, dtype=np.int32) * 2).reshape(2, 3), "result shape (2, 3), input (6,)"),
    (np.arange(6, dtype=np.int32) * 3, "differs from MPI_Allreduce"),
    ([0, 2, 4, 6, 8, 10], "returned list, not an ndarray"),
])
def test_dtype_shape_and_values_compare_exactly(got, words):
    assert _case(np.arange(6, dtype=np.int32), got) == words


def test_a_changed_input_buffer_is_a_failure():
    x = np.arange(6, dtype=np.float32)
    before = x.copy()
    x[3] = -1                                     # as if the call had written into it
    assert _case(x, x.astype(np.float32) * 2, before=before) == "the input buffer changed"
    assert _case(x, x.astype(np.float32) * 2, before=before, in_place=True) == ""


def test_corrupt_changes_one_element_of_every_kind():
    for name in v.DTYPES:
        x = v.sample(v._BY_NAME[name], "band" if name == "bool" else "sum", 5, 0)
        y = x.copy()
        from mlcomm.benchmark.harness import corrupt
        corrupt(y)
        assert y.tobytes()[:x.itemsize] != x.tobytes()[:x.itemsize], name
        assert y.tobytes()[x.itemsize:] == x.tobytes()[x.itemsize:], name


def test_defaults_cover_every_kernel_dtype_and_op():
    from mlcomm import kernels
    algorithms, dtypes, ops = v._check_names(None, None, None)
    assert dtypes == list(kernels.DTYPES) and ops == list(kernels.OPS)
    assert algorithms[-1] == "mpi" and "auto" in algorithms


@pytest.mark.parametrize("kw, words", [
    (dict(ops=["summ"]), "unknown reduction op 'summ'; choose one of sum, prod"),
    (dict(dtypes=["float7"]), "unknown dtype 'float7'; choose from int8"),
    (dict(algorithms=["nonesuch"]), "algorithm='nonesuch' is not a known allreduce"),
])
def test_unknown_names_are_errors(kw, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        v._check_names(kw.get("algorithms"), kw.get("dtypes"), kw.get("ops"))


def test_a_row_without_cases_is_a_skip_not_a_pass():
    assert v._plan_row("mpi", np.dtype(np.float16), ["sum"]) == \
        ([], "MPI has no float16 reduction")
    row = v.Row("mpi", "float16", skipped="MPI has no float16 reduction")
    assert (row.status, row.verdict) == ("SKIP", "SKIP (MPI has no float16 reduction)")
    assert v._plan_row("ring", np.dtype(bool), ["sum", "avg"]) == \
        ([], "no op given applies to bool")
    assert v._plan_row("ring", np.dtype(bool), ["sum", "band", "lor"]) == (["band", "lor"], "")
    assert v._plan_row("mpi", np.dtype(bool), ["band", "bxor", "lor"]) == \
        (["lor"], "band,bxor left out: MPI has no bitwise op on bool")
    assert v.Row("mpi", "bool", cases=2, note="band left out: x").verdict == \
        "PASS (band left out: x)"
    assert v.Row("ring", "int32", cases=4).verdict == "PASS"
    assert v.Row("ring", "int32", cases=4, failures=1, first_failure="x").verdict == "FAIL (x)"


# ----------------------------------------------------------------- mpiexec jobs

def test_one_wrong_rank_fails_every_rank_and_never_hangs():
    """Rank 1 alone gets a wrong answer: the command fails, names rank 1, ends in seconds."""
    proc = mpirun(3, VERIFY + ["-a", "ring,recursive_doubling", "-d", "int32,float32",
                               "-o", "sum"], env={v.CORRUPT_RANK_ENV: "1"}, timeout=60,
                  check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("ring", "recursive"))]
    assert len(rows) == 4 and all(" FAIL (op=sum count=1 out-of-place: rank 1: differs from "
                                  "MPI_Allreduce)" in r for r in rows), proc.stdout
    # 4 rows x 6 counts x 2 placements; a count of 0 has no element to change
    assert "FAILED: 40 of 48 cases" in proc.stdout and "ALL PASSED" not in proc.stdout


_EVERY_RANK = """
from mpi4py import MPI
from mlcomm.verify import verify
rows = verify(MPI.COMM_WORLD, ["ring"], ["int64"], ["max"], counts=[5, 1000])
print(f"rank {MPI.COMM_WORLD.Get_rank()}: {rows[0].status} {rows[0].failures}/{rows[0].cases}")
"""


def test_every_rank_sees_the_failure(tmp_path):
    script = tmp_path / "every_rank.py"
    script.write_text(_EVERY_RANK)
    proc = mpirun(3, [script], env={v.CORRUPT_RANK_ENV: "2"}, timeout=60)
    # the ranks' lines reach mpiexec's stdout in any order, and may share a line
    got = sorted(re.findall(r"rank \d+: \w+ \d+/\d+", proc.stdout))
    assert got == [f"rank {r}: FAIL 4/4" for r in range(3)], proc.stdout


def test_unknown_op_is_an_error_printed_once():
    proc = mpirun(3, VERIFY + ["--op", "sum,summ"], timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("unknown reduction op 'summ'; choose one of sum, prod, min") == 1
    assert proc.stderr.count("usage:") == 1


def test_unknown_dtype_is_an_error_naming_the_valid_ones():
    proc = mpirun(2, VERIFY + ["-d", "float32,nonsense"], timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("unknown dtype 'nonsense'; choose from int8, int16") == 1


def test_skipped_rows_are_not_passes():
    proc = mpirun(2, VERIFY + ["-a", "mpi,ring", "-d", "float16,int32", "-o", "sum"],
                  timeout=60)
    lines = {tuple(line.split()[:2]): line for line in proc.stdout.splitlines()
             if line.startswith(("mpi ", "ring "))}
    assert len(lines) == 4
    skip = lines[("mpi", "float16")]
    assert skip.split()[2:4] == ["0", "0"] and skip.endswith("SKIP (MPI has no float16 reduction)")
    assert all(lines[k].endswith("PASS") for k in lines if k != ("mpi", "float16"))
    assert "ALL PASSED: 30 cases, 1 rows skipped" in proc.stdout    # 3 rows x 5 counts x 2
    proc = mpirun(2, VERIFY + ["-a", "mpi", "-d", "bfloat16"], timeout=60, check=False)
    assert proc.returncode == 1 and "NOTHING CHECKED: 0 cases, 1 rows skipped" in proc.stdout

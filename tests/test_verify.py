"""``mlcomm verify`` cannot lie: one wrong rank fails every rank, integers meet the exact
answer and floats their schedule run locally, a wrong MPI library is blamed as such, bad
names are errors, a row without cases is a SKIP, dtype, shape and the input buffer are
checked. Faults are injected by patching verify's calls in a job's script, never by a
variable the product reads."""

import re

import numpy as np
import pytest

from mlcomm.benchmark import verify as v

from conftest import mpirun

VERIFY = ["-m", "mlcomm", "verify"]


# ----------------------------------------------------------------- no MPI job

def _case(x, got, in_place=False, before=None):
    return v._problem(got, x, x.copy() if before is None else before, in_place)


def test_a_right_answer_has_no_problem():
    x = np.arange(6, dtype=np.int32)
    assert _case(x, x * 2) == ""
    assert v._value_problem(x * 2, x * 2, 2, "sum", False, right=x * 2) == ("", False)


@pytest.mark.parametrize("got, words", [
    (np.arange(6, dtype=np.int64) * 2, "result dtype int64, input int32"),
    ((np.arange(6, dtype=np.int32) * 2).reshape(2, 3), "result shape (2, 3), input (6,)"),
    ([0, 2, 4, 6, 8, 10], "returned list, not an ndarray"),
])
def test_dtype_and_shape_compare_exactly(got, words):
    assert _case(np.arange(6, dtype=np.int32), got) == words


def test_a_changed_input_buffer_is_a_failure():
    x = np.arange(6, dtype=np.float32)
    before = x.copy()
    x[3] = -1                                     # as if the call had written into it
    assert _case(x, x * 2, before=before) == "the input buffer changed"
    assert _case(x, x * 2, before=before, in_place=True) == ""


def test_the_exact_answer_wraps_around_as_c_does():
    """1,000 int8 values of 100 on three ranks: C, NumPy, MPICH give 44 (300 - 256)."""
    hundreds = [np.full(1000, 100, np.int8)] * 3
    assert (v.exact(hundreds, "sum") == 44).all()
    assert v.exact([np.array([200], np.uint8)] * 2, "sum")[0] == 144
    assert v.exact([np.array([-128], np.int8), np.array([-1], np.int8)], "prod")[0] == -128
    assert v.exact([np.array([300], np.int16)] * 2, "prod")[0] == 90000 - 65536
    assert v.exact([np.array([7, 0], np.int32), np.array([2, 5], np.int32)], "land").tolist() \
        == [1, 0]
    assert v.exact([np.array([7], np.int64)], "lor")[0] == 7    # one rank: its own input
    assert v.exact([np.array([True, True]), np.array([True, False])] * 2, "bxor").tolist() \
        == [False, False]


def test_a_wrong_library_is_named_with_its_value_and_cs():
    right = v.exact([np.full(1000, 100, np.int8)] * 3, "sum")
    saturated = np.full(1000, 127, np.int8)
    assert v.library_error(saturated, right, "sum", 3) == (
        "the MPI library's MPI_Allreduce is wrong here: int8 sum 1000 elements at P = 3: "
        "got 127 where C gives 44 (first differing element 0)")
    assert v.library_error(right, right, "sum", 3) == ""


def test_only_a_call_that_ran_the_library_may_return_its_wrong_answer():
    """``mpi``, or ``auto`` where it chose ``mpi``; any other algorithm must be exact."""
    right = v.exact([np.full(8, 100, np.int8)] * 3, "sum")
    saturated = np.full(8, 127, np.int8)
    check = lambda got, library: v._value_problem(got, saturated, 3, "sum", library, right)
    assert check(saturated, True) == ("", True)
    assert check(saturated, False) == \
        ("differs from the exact answer (element 0: 127 where C gives 44)", False)
    wrong = saturated.copy()
    wrong[0] = 0           # neither C's answer nor the library's: mlcomm's fault
    assert check(wrong, True)[0].startswith("differs from the exact answer (element 0: 0 ")
    assert check(right, True) == ("", False)


def test_a_float_result_must_match_its_schedule_bit_for_bit():
    """A lost contribution that the rounding bound against MPI_Allreduce lets through (bfloat16
    prod at P = 3: each factor is within 10 % of 1, the bound 4 P eps is 9 %) is caught."""
    dtype, p = v.BFLOAT16, 3
    inputs = [v.sample(dtype, "prod", 1000, r) for r in range(p)]
    right = v.scheduled("ring", (), inputs, "prod", 0)
    lost = v.scheduled("ring", (), [inputs[0], np.ones_like(inputs[1]), inputs[2]], "prod", 0)
    want = np.prod([x.astype(np.float64) for x in inputs], axis=0)  # MPI_Allreduce's, wider
    assert v.close(right, want, p, "prod") and v.close(lost, want, p, "prod")
    check = lambda got: v._value_problem(got, want, p, "prod", False, local=right)[0]
    assert check(right) == ""
    assert check(lost).startswith("differs from its schedule run by the local executor "
                                  "(element ")
    assert check(right * 2) == "differs from MPI_Allreduce beyond rounding"


def test_a_schedule_the_local_executor_rejects_is_a_failure_not_a_crash():
    inputs = [np.ones(5, np.float32)] * 2
    assert v.scheduled("ring", (("nonesuch", 1),), inputs, "sum", 0).startswith(
        "the local executor failed on its schedule: ")


def test_the_exit_status_says_who_failed():
    passed = v.Row("ring", "int8", cases=2)
    failed = v.Row("ring", "int8", cases=2, failures=1, first_failure="x")
    library = v.Row("mpi", "int8", cases=2, library=1, first_library="y")
    assert (library.status, library.verdict) == ("LIB", "LIB (y)")
    assert v.Report([passed]).status == v.PASSED == 0
    assert v.Report([passed, library], ["line"]).status == v.LIBRARY_WRONG == 3
    assert v.Report([failed, library], ["line"]).status == v.FAILED == 1
    assert v.Report([v.Row("mpi", "float16", skipped="x")]).status == v.FAILED


def test_defaults_cover_every_kernel_dtype_and_op():
    from mlcomm import kernels
    algorithms, dtypes, ops = v._check_names(None, None, None)
    assert dtypes == list(kernels.DTYPES) and ops == list(kernels.OPS)
    assert algorithms[-1] == "mpi" and "auto" in algorithms


@pytest.mark.parametrize("kw, words", [
    (dict(ops=["summ"]), "unknown reduction op 'summ'; choose one of sum, prod"),
    (dict(dtypes=["float7"]), "unknown dtype 'float7'; choose from int8"),
    (dict(algorithms=["nonesuch"]), "algorithm='nonesuch' is not a known allreduce"),
    (dict(counts=[5, -1]), "counts=[5, -1]: give whole numbers of elements, 0 or more"),
])
def test_unknown_names_are_errors(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        v._check_names(kw.get("algorithms"), kw.get("dtypes"), kw.get("ops"), kw.get("counts"))


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

#: a job's script: patches one of verify's calls (``PATCH``), then runs ``mlcomm verify``
_JOB = """
import sys
import numpy as np
from mpi4py import MPI
import mlcomm.benchmark.verify as v
from mlcomm.cli import main
rank = MPI.COMM_WORLD.Get_rank()
{patch}
sys.exit(main({argv!r}))
"""

#: rank 1 changes element 0 of every result it gets
_WRONG_ON_RANK_1 = """
real = v.allreduce
def allreduce(sendbuf, recvbuf=None, op="sum", **kw):
    got = real(sendbuf, recvbuf, op, **kw)
    if rank == 1 and got.size:
        got[:1] = got[:1] ^ 1 if got.dtype.kind in "iu" else (abs(got[:1]) + 1) * 3
    return got
v.allreduce = allreduce
"""

#: rank 1's contribution is lost: it reduces the identity of prod instead of its input
_LOST_ON_RANK_1 = """
real = v.allreduce
def allreduce(sendbuf, recvbuf=None, op="sum", **kw):
    if rank == 1 and op == "prod":
        if recvbuf is not None:
            recvbuf[...] = 1
        else:
            sendbuf = np.ones_like(sendbuf)
    return real(sendbuf, recvbuf, op, **kw)
v.allreduce = allreduce
"""

#: a library whose int8 sum saturates at -128 and 127 where C wraps around
_SATURATING_LIBRARY = """
real = v.reference
def reference(comm, x, op):
    if x.dtype != np.int8 or op != "sum":
        return real(comm, x, op)
    wide = np.empty(x.size, np.int64)
    comm.Allreduce(x.astype(np.int64), wide)
    return np.clip(wide, -128, 127).astype(np.int8)
v.reference = reference
"""


def _job(tmp_path, patch, argv, nprocs=3):
    script = tmp_path / "job.py"
    script.write_text(_JOB.format(patch=patch, argv=argv))
    return mpirun(nprocs, [script], timeout=300, check=False)


def _rows(proc, *names):
    return [line for line in proc.stdout.splitlines() if line.startswith(names)]


def test_one_wrong_rank_fails_every_rank_and_never_hangs(tmp_path):
    """Rank 1 alone gets a wrong answer: the command fails, names rank 1, ends in seconds."""
    proc = _job(tmp_path, _WRONG_ON_RANK_1, ["verify", "-a", "ring,recursive_doubling",
                                             "-d", "int32,float32", "-o", "sum"])
    assert proc.returncode == v.FAILED, proc.stdout + proc.stderr
    rows = _rows(proc, "ring", "recursive")
    assert len(rows) == 4, proc.stdout
    # rank 1 fails the exact check where it makes the references, else differs from the rank
    # that made them
    assert all(re.search(r" FAIL \(op=sum count=1 out-of-place: rank 1: differs from (the "
                         r"exact answer \(element 0: |rank \d's result, which matches the "
                         r"reference\)$)", r) for r in rows if " int32 " in r), rows
    assert all(" FAIL (op=sum count=1 out-of-place: rank 1: differs from MPI_Allreduce beyond "
               "rounding)" in r for r in rows if " float32 " in r), rows
    # 4 rows x 6 counts x 2 placements; a count of 0 has no element to change
    assert "FAILED: 40 of 48 cases" in proc.stdout and "ALL PASSED" not in proc.stdout
    assert "MPI_Allreduce is wrong" not in proc.stdout


_EVERY_RANK = """
from mlcomm.benchmark.verify import verify
report = verify(MPI.COMM_WORLD, ["ring"], ["int64"], ["max"], counts=[5, 1000])
row = report.rows[0]
print(f"rank {rank}: {row.status} {row.failures}/{row.cases} status {report.status}")
sys.exit(0)
"""


def test_every_rank_sees_the_failure(tmp_path):
    proc = _job(tmp_path, _WRONG_ON_RANK_1 + _EVERY_RANK, [])
    # the ranks' lines reach mpiexec's stdout in any order, and may share a line
    got = sorted(re.findall(r"rank \d+: \w+ \d+/\d+ status \d", proc.stdout))
    assert got == [f"rank {r}: FAIL 4/4 status 1" for r in range(3)], proc.stdout + proc.stderr


def test_a_lost_contribution_in_bfloat16_fails_the_exact_check(tmp_path):
    """Every result lies within rounding of MPI_Allreduce, yet none is the schedule's."""
    proc = _job(tmp_path, _LOST_ON_RANK_1, ["verify", "-a", "ring,auto", "-d", "bfloat16",
                                            "-o", "prod"])
    assert proc.returncode == v.FAILED, proc.stdout + proc.stderr
    rows = _rows(proc, "ring", "auto")
    assert len(rows) == 2 and all(" FAIL (op=prod count=" in r and ": differs from its "
                                  "schedule run by the local executor (element " in r
                                  for r in rows), proc.stdout
    assert "beyond rounding" not in proc.stdout
    # 2 rows x 6 counts x 2 placements; a count of 0 loses nothing
    assert "FAILED: 20 of 24 cases" in proc.stdout


def test_a_library_that_saturates_is_blamed_not_mlcomm(tmp_path):
    """Open MPI 5.0.11's int8 sum saturates on 1,000 elements (docs/reliability.rst)."""
    proc = _job(tmp_path, _SATURATING_LIBRARY, ["verify", "-a", "ring,shared_memory",
                                                "-d", "int8,int32", "-o", "sum"])
    assert proc.returncode == v.LIBRARY_WRONG, proc.stdout + proc.stderr
    rows = _rows(proc, "ring", "shared_memory")
    assert len(rows) == 4 and all(r.endswith(" PASS") for r in rows), proc.stdout
    lines = [line for line in proc.stdout.splitlines() if "MPI_Allreduce is wrong here" in line]
    assert lines and all(re.fullmatch(
        r"the MPI library's MPI_Allreduce is wrong here: int8 sum (1000|65537) elements at "
        r"P = 3: got (127|-128) where C gives -?\d+ \(first differing element \d+\)", line)
        for line in lines), lines
    assert f"MPI LIBRARY WRONG: mlcomm passed all 48 cases; the MPI library's MPI_Allreduce " \
           f"is wrong in {len(lines)} of 12 reductions with an exact answer (above), which " \
           f"is not mlcomm's failure" in proc.stdout
    assert "FAIL" not in proc.stdout and "ALL PASSED" not in proc.stdout


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

"""The docs build with warnings as errors, and every Python example in them runs.

The rule for examples (stated in docs/index.rst): every ``.. code-block:: python`` block
in README.rst and docs/*.rst is a complete program, run here under
``mpiexec -n 2 python -m mpi4py FILE`` (an exception on one rank aborts the job instead of
leaving the other waiting) with ``NUMBA_ENABLE_CUDASIM=1`` (so GPU examples with Numba
device arrays run on the CUDA simulator). Shell commands are ``bash`` blocks and other
listings plain ``::`` blocks; neither is run.
"""

import re
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, mpirun

DOCS = ROOT / "docs"
SOURCES = [ROOT / "README.rst", ROOT / "CHANGELOG.rst", *sorted(DOCS.glob("*.rst"))]
README_MAX_LINES = 350
LANGUAGES = {"python", "bash", "console", "text", "none", "json"}   # only python runs

_CODE_BLOCK = re.compile(r"^(?P<indent>[ \t]*)\.\. code-block::[ \t]*(?P<language>\S*)[ \t]*$")
_OPTION = re.compile(r"^[ \t]+:[\w-]+:")


def _indent(line):
    return len(line) - len(line.lstrip())


def code_blocks(path):
    """Return ``(line, language, code)`` for every ``.. code-block::`` in ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = _CODE_BLOCK.match(lines[i])
        i += 1
        if not match:
            continue
        indent, first = _indent(lines[i - 1]), i          # the directive's line, from 1
        while i < len(lines) and _OPTION.match(lines[i]):
            i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
            body.append(lines[i])
            i += 1
        code = textwrap.dedent("\n".join(body)).strip("\n")
        blocks.append((first, match["language"], code + "\n"))
    return blocks


EXAMPLES = [pytest.param(code, id=f"{path.relative_to(ROOT)}:{line}")
            for path in SOURCES for line, language, code in code_blocks(path)
            if language == "python"]


def test_docs_build_without_warnings(tmp_path):
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
           "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} hung for 600 s\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, (f"sphinx-build failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-6000:]}\n{proc.stderr[-8000:]}")
    assert (tmp_path / "html" / "api.html").is_file()


def run_example(code, tmp_path):
    """Run ``code`` as the rule says; fail the test if it exits non-zero (a failed assert on
    any rank aborts the job) or prints FAIL."""
    example = tmp_path / "example.py"
    example.write_text(code, encoding="utf-8")
    proc = mpirun(2, ["-m", "mpi4py", example], timeout=180, cwd=tmp_path,
                  env={"NUMBA_ENABLE_CUDASIM": "1"})
    if re.search(r"\bFAIL", proc.stdout + proc.stderr):
        pytest.fail(f"the example printed FAIL:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs_under_mpiexec(code, tmp_path):
    run_example(code, tmp_path)


@pytest.mark.parametrize("code", ["from mpi4py import MPI\nassert MPI.COMM_WORLD.rank != 1\n",
                                  "print('check: FAIL')\n"], ids=["assert", "prints-FAIL"])
def test_an_example_that_asserts_false_or_prints_fail_fails(code, tmp_path):
    with pytest.raises(pytest.fail.Exception):
        run_example(code, tmp_path)


def test_every_code_block_follows_the_rule():
    """Python is shown only as ``code-block:: python`` (which runs); other languages are known."""
    seen = {}
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        for directive in (".. code::", ".. sourcecode::"):
            assert directive not in text, f"{path.name}: use '.. code-block:: LANGUAGE'"
        for line, language, code in code_blocks(path):
            assert language in LANGUAGES, (f"{path.name}:{line}: code-block language "
                                           f"{language!r}; use one of {sorted(LANGUAGES)}")
            assert code.strip(), f"{path.name}:{line}: empty code block"
            seen[language] = seen.get(language, 0) + 1
    assert seen.get("python", 0) == len(EXAMPLES) >= 8


def test_code_blocks_are_extracted_whole(tmp_path):
    text = textwrap.dedent("""\
        Intro.

        .. code-block:: python
           :caption: one

           import os

           x = 1
               # indented deeper
        after the block

          .. code-block:: bash

             echo hi
        """)
    path = tmp_path / "sample.rst"
    path.write_text(text, encoding="utf-8")
    assert code_blocks(path) == [(3, "python", "import os\n\nx = 1\n    # indented deeper\n"),
                                 (12, "bash", "echo hi\n")]


def test_readme_is_short_valid_and_links_what_exists():
    """README.rst is rendered by docutils alone (PyPI, GitHub), outside the Sphinx build."""
    import docutils.core

    readme = ROOT / "README.rst"
    text = readme.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES, "README.rst is too long"
    assert any(language == "python" for _, language, _ in code_blocks(readme))
    docutils.core.publish_doctree(text, source_path=str(readme),
                                  settings_overrides={"halt_level": 2, "report_level": 2})
    targets = re.findall(r"<([\w./-]+\.rst)>`_", text) + re.findall(r"\.\. image:: (\S+)", text)
    assert targets and [t for t in targets if not (ROOT / t).is_file()] == []


def test_the_tuning_page_has_a_row_for_every_constant():
    """docs/tuning.rst names every constant of ``mlcomm.session.auto.tuning``."""
    from mlcomm.session.auto import tuning

    text = (DOCS / "tuning.rst").read_text(encoding="utf-8")
    assert tuning.__all__ and [n for n in tuning.__all__ if f"``{n}``" not in text] == []

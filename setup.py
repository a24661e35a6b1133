from setuptools import setup

TORCH = ["torch==2.13.0"]
DOCS = ["sphinx>=7", "furo>=2024.1"]   # the test suite builds the docs too

setup(
    name="mlcomm",
    version="0.1.0",
    description="Hand-written MPI all-reduce algorithms as verified schedules, "
                "with a benchmark, a cost simulator and a data-parallel SGD trainer",
    long_description=open("README.rst", encoding="utf-8").read(),
    long_description_content_type="text/x-rst",
    python_requires=">=3.10",
    packages=["mlcomm", "mlcomm.algorithms", "mlcomm.analysis",
              "mlcomm.benchmark", "mlcomm.trainer", "mlcomm.kernels"],
    package_dir={"mlcomm.kernels": "kernels"},
    install_requires=[
        "mpi4py>=4.0",
        "numpy>=1.24",
        "numba>=0.59",
        "ml_dtypes>=0.3",
        "matplotlib>=3.7",
        "tqdm>=4.60",
        "scikit-learn>=1.3",
    ],
    extras_require={
        "mpich": ["mpich>=4.1"],
        "cupy": ["cupy-cuda12x>=13"],
        "docs": DOCS,
        # the CPU build that installs from a file on the team's machines; an unpinned torch
        # pulls several GB of CUDA packages
        "torch": TORCH,
        "test": ["pytest>=7", "pytest-mpi>=0.6", "hypothesis>=6", *DOCS, *TORCH],
    },
    entry_points={"console_scripts": ["mlcomm = mlcomm.cli:main"]},
)

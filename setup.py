import re
from pathlib import Path

from setuptools import find_packages, setup

# the version lives in one place, exgrpo/__init__.py (read as text: installing must not import the package)
VERSION = re.search(
    r'^__version__ = "([^"]+)"$', (Path(__file__).parent / "exgrpo/__init__.py").read_text(encoding="utf-8"), re.M
)[1]

setup(
    name="exgrpo",
    version=VERSION,
    description="ExGRPO (Experiential Group Relative Policy Optimization) as a recipe on verl 0.9.1",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["exgrpo", "exgrpo.*", "recipe", "recipe.*", "data_preprocess"]),
    package_data={"recipe.exgrpo": ["config/*.yaml"]},
    install_requires=["numpy", "pyarrow>=19.0.0", "torch", "safetensors", "tqdm", "math-verify", "pandas"],
    extras_require={
        "verl": ["verl==0.9.1", "hydra-core"],
        "plot": ["matplotlib"],
        "dev": ["pytest", "pytest-timeout", "ruff"],
    },
    entry_points={"console_scripts": ["exgrpo-eval=exgrpo.eval.cli:main", "exgrpo-pool=exgrpo.pool.cli:main"]},
)

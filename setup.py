"""The wheel's packages, found rather than listed: every package under ``autotune/`` (so a
new one, such as a backend's, is never left out of an installed autotune) and
``search_spaces/``, shipped inside it as ``autotune.search_spaces`` (pyproject.toml maps the
folder and ships its YAML files). Everything else about the build is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["autotune", "autotune.*"]), "autotune.search_spaces"])

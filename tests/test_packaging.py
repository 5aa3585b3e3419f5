"""The installed package (the image's `pip install .`, not the editable install the tests run from)
holds every package of the tree: each folder with an __init__.py under our top-level packages is
one setuptools finds with pyproject.toml's include patterns."""
from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parent.parent


def test_every_package_of_the_tree_is_installed():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = set(find_packages(str(REPO), include=config["include"]))
    tops = {pattern.split(".")[0] for pattern in config["include"]}
    tree = {str(init.parent.relative_to(REPO)).replace("/", ".")
            for top in tops for init in (REPO / top).rglob("__init__.py")}
    assert tree, "no packages found under " + ", ".join(sorted(tops))
    assert tree <= found, f"left out of the installed package: {sorted(tree - found)}"

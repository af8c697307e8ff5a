"""Package discovery only (metadata lives in pyproject.toml).

The repo's top-level folders are mapped into the ``loraplex`` namespace. ``platform/`` has no
``__init__.py`` on purpose (it would shadow the standard library's ``platform`` module whenever the
repo root is on sys.path), so setuptools' finders can't see it: we walk the folders ourselves.
"""

import os

from setuptools import setup

FOLDERS = {
    "loraplex.platform": "platform",
    "loraplex.engine": "engine",
    "loraplex.kernels": "kernels",
    "loraplex.migrations": "migrations",
    "loraplex.admin_ui": "admin_ui",
}


def _packages():
    found = []
    for package, folder in FOLDERS.items():
        for dirpath, dirnames, _files in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            rel = os.path.relpath(dirpath, folder)
            found.append(package if rel == "." else package + "." + rel.replace(os.sep, "."))
    return found


setup(
    package_dir=FOLDERS,
    packages=_packages(),
    package_data={
        "loraplex.migrations": ["*.mako", "*.ini"],
        "loraplex.admin_ui": ["**/*"],
        "loraplex.kernels": ["csrc/*.cpp", "csrc/*.h"],
    },  # native CPU kernels are built from source on first use
    include_package_data=True,
)

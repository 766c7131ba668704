"""Maps the project's folders under one ``schedtrace`` namespace.

``tracer/``, ``arms/``, ``replay/`` and ``tui/`` install as ``schedtrace.tracer``,
``schedtrace.arms``, ``schedtrace.replay`` and ``schedtrace.tui``, so nothing
schedtrace installs can shadow, or be shadowed by, the PyPI projects named
tracer, replay or tui.
Everything else about the distribution is in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "schedtrace": "schedtrace",
    "schedtrace.tracer": "tracer",
    "schedtrace.arms": "arms",
    "schedtrace.replay": "replay",
    "schedtrace.tui": "tui",
}

packages = []
for name, folder in FOLDERS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(package_dir=FOLDERS, packages=packages)

"""The one packaging fact pyproject.toml cannot state: the repository's top-level ``suites/``
folder ships inside the package as ``conformance.suites``, so an installed wheel carries the
suites that ``tim-conformance certify`` runs, while a clone keeps ``pytest suites/``.

(``[tool.setuptools.packages.find]`` finds packages under their own folders only; a package
mapped from another folder has to be listed next to what it finds, which only ``setup()`` can.)
Everything else — metadata, entry points, package data — is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["conformance*"]), "conformance.suites"],
    package_dir={"conformance.suites": "suites"},
)

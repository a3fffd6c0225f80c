"""setuptools hook: ship ``dfkv-lmcache.pth`` at the root of the wheel (site-packages).

Everything else is declared in pyproject.toml. A ``.pth`` file must sit in site-packages
itself, which pyproject's declarative options cannot express; it runs ``_dfkv_lmcache_hook``
at interpreter start so LMCache's own adapter discovery finds ``dfkv://`` remote URLs
(docs/CONNECTORS.md §4).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "dfkv-lmcache.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        self.copy_file(os.path.join(here, PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})

"""Build hook: the wheel carries the built-in topologies and configs as package data.

The files live once at the repository root (``topologies/``, ``configs/``); this copies them into
``zerotopo/builtin/`` of the build, where :mod:`zerotopo.resources` finds them after a normal install.
Everything else is configured in ``pyproject.toml``.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUILTINS = {"topologies": ("*.yaml",), "topologies/bandwidth": ("*.yaml",), "configs": ("*.yml", "*.yaml")}


class BuildPyWithBuiltins(build_py):
    def run(self):
        super().run()
        for kind, patterns in BUILTINS.items():
            dest = Path(self.build_lib) / "zerotopo" / "builtin" / kind
            self.mkpath(str(dest))
            for pattern in patterns:
                # Subdirectories too (topologies/bandwidth/ holds measured bandwidth tables).
                for src in sorted((ROOT / kind).rglob(pattern)):
                    target = dest / src.relative_to(ROOT / kind)
                    self.mkpath(str(target.parent))
                    self.copy_file(str(src), str(target))


setup(cmdclass={"build_py": BuildPyWithBuiltins})

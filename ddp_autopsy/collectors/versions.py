"""Versions read from a running process itself, not from the collector's environment.

* Python — ``Python v3.11.7`` in the py-spy text header, else ``libpython3.11.so`` in the maps, else
  the executable's name (``python3.11``).
* torch — the ``torch/`` package that ``libtorch*.so`` in ``/proc/PID/maps`` lives in:
  ``torch/version.py`` gives ``__version__`` and ``cuda`` (read as text, never imported).
* NCCL / CUDA runtime — ``libnccl.so.2.21.5`` / ``libcudart.so.12.4.127`` in the maps; pip wheels
  ship ``libnccl.so.2``, so the version then comes from the ``nvidia_nccl_cu12-X.dist-info`` next to
  the ``nvidia/`` package.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_PYSPY_HEADER = re.compile(r"^Python v(\d+\.\d+(?:\.\d+)?\S*)", re.MULTILINE)
_LIBPYTHON = re.compile(r"libpython(\d+\.\d+)")
_EXE_PYTHON = re.compile(r"python(\d+\.\d+)")
_TORCH_LIB = re.compile(r"^(?P<dir>.*/torch)/lib/lib(?:torch|c10)[^/]*\.so")
_VERSION_PY = re.compile(r"^(__version__|cuda)\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)
_LIB_VERSION = re.compile(r"/lib(?P<name>nccl|cudart)\.so\.(?P<ver>\d+(?:\.\d+)*)$")
_DIST_INFO = {"nccl": re.compile(r"^nvidia_nccl_cu\d+-(?P<ver>[\d.]+)\.dist-info$"),
              "cudart": re.compile(r"^nvidia_cuda_runtime_cu\d+-(?P<ver>[\d.]+)\.dist-info$")}


def python_version(pyspy_text: str | None, maps: list[str], exe: str | None) -> str | None:
    if pyspy_text and (m := _PYSPY_HEADER.search(pyspy_text)):
        return m[1]
    for path in maps:
        if m := _LIBPYTHON.search(os.path.basename(path)):
            return m[1]
    if exe and (m := _EXE_PYTHON.search(os.path.basename(os.path.realpath(exe)))):
        return m[1]
    return None


def torch_dir(maps: list[str]) -> str | None:
    for path in maps:
        if m := _TORCH_LIB.match(path):
            return m["dir"]
    return None


def torch_version(maps: list[str]) -> tuple[str | None, str | None]:
    """``(torch.__version__, torch.version.cuda)`` of the torch the process loaded."""
    tdir = torch_dir(maps)
    if tdir is None:
        return None, None
    try:
        text = Path(tdir, "version.py").read_text(errors="replace")
    except OSError:
        return None, None
    found = dict(_VERSION_PY.findall(text))
    return found.get("__version__"), found.get("cuda")


def _lib_version(maps: list[str], name: str) -> tuple[str | None, str | None]:
    """``(version, library path)`` for ``libnccl``/``libcudart`` mapped into the process."""
    for path in maps:
        m = _LIB_VERSION.search(path)
        if not m or m["name"] != name:
            continue
        version = m["ver"] if m["ver"].count(".") >= 1 else None
        # pip layout: site-packages/nvidia/<pkg>/lib/libX.so.N
        parts = Path(path).parts
        if version is None and "nvidia" in parts:
            site = Path(*parts[:parts.index("nvidia")])
            try:
                for entry in os.listdir(site):
                    if dm := _DIST_INFO[name].match(entry):
                        version = dm["ver"]
                        break
            except OSError:
                pass
        return version or m["ver"], path
    return None, None


def versions(maps: list[str], exe: str | None, pyspy_text: str | None) -> dict[str, str | None]:
    torch, torch_cuda = torch_version(maps)
    nccl, nccl_lib = _lib_version(maps, "nccl")
    cuda, _ = _lib_version(maps, "cudart")
    return {"python": python_version(pyspy_text, maps, exe), "torch": torch,
            "torch_cuda": torch_cuda, "nccl": nccl, "cuda": cuda, "nccl_lib": nccl_lib,
            "torch_dir": torch_dir(maps)}

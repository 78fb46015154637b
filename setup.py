"""The optional native Flight Recorder reader (everything else is in pyproject.toml).

Without a C compiler the build skips it and Python's unpickler reads every dump
(``ddp_autopsy/analyzer/flight_recorder.py``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ddp_autopsy.analyzer._frpickle",
                             ["ddp_autopsy/analyzer/_frpickle.c"], optional=True)])

"""Where each rank is: main-thread stacks, whether they wait in a collective, and the frame that
names the place (``evaluate``, ``__getitem__``, ``save_checkpoint``...)."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: torch.distributed calls that block until the other ranks arrive.
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "_all_gather_base",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast",
    "broadcast_object_list", "reduce", "barrier", "monitored_barrier", "gather", "gather_object",
    "scatter", "scatter_object_list", "all_to_all", "all_to_all_single", "send", "recv", "wait",
    "batch_isend_irecv", "_store_based_barrier", "new_group", "init_process_group",
})
LIBRARY_FILE = re.compile(
    r"(?:^|/)(?:torch|torchvision|numpy|lightning|pytorch_lightning|deepspeed|accelerate|"
    r"transformers|threading|multiprocessing|concurrent|queue|selectors|socket|asyncio|"
    r"importlib|runpy|contextlib|functools|site-packages/[^/]+)/|^<frozen|python3\.\d+/[^/]+\.py$"
    r"|^(?:threading|queue|selectors|socket|subprocess|runpy|contextlib|functools|selectors)\.py$"
)
DATA_LOADING = re.compile(r"torch/utils/data/")
PLACES = (
    ("data loading", re.compile(r"__getitem__|__iter__|__next__|collate|load_batch|dataloader",
                                re.I)),
    ("checkpoint save", re.compile(r"save|checkpoint|ckpt|torch\.save", re.I)),
    ("evaluation", re.compile(r"eval|valid|test|predict|infer|metric", re.I)),
    ("logging / I/O", re.compile(r"log|write|flush|upload|download|read|open", re.I)),
)


BACKWARD_WAITS = frozenset({"_engine_run_backward", "run_backward"})


def is_backward_wait(frame: Frame) -> bool:
    """Autograd's engine entry: where DDP ranks block on the gradient all-reduce."""
    return frame.func in BACKWARD_WAITS and "torch/autograd" in (frame.file or "")


def wait_label(frame: Frame | None) -> str:
    """How to name what a rank waits in: ``all_reduce``, or DDP's gradient all-reduce."""
    if frame is None:
        return "a collective"
    if is_backward_wait(frame):
        return "DDP's gradient all-reduce (in backward)"
    return frame.func


@dataclass
class Frame:
    func: str
    file: str
    line: int | None
    native: bool = False  # a C/C++ frame (py-spy --native): ``file`` is its library

    def __str__(self) -> str:
        if self.native:
            return f"{self.func} ({self.file})"
        return f"{self.func} ({self.file}:{self.line})"


@dataclass
class RankStack:
    rank: int | None
    pid: int | None
    host: str | None
    source: str
    idle: bool
    frames: list[Frame]  # innermost first

    @property
    def collective(self) -> Frame | None:
        """The torch.distributed call this thread waits in, if any. An idle thread inside
        autograd's backward waits for DDP's gradient all-reduce (an implicit collective)."""
        for f in self.frames:
            if f.func in COLLECTIVES and "torch/distributed" in (f.file or ""):
                return f
        if self.idle:
            for f in self.frames[:4]:
                if is_backward_wait(f):
                    return f
        return None

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame of the user's own code (not torch, not the standard library)."""
        for f in self.frames:
            if not LIBRARY_FILE.search(f.file or ""):
                return f
        return self.frames[0] if self.frames else None

    @property
    def place(self) -> str | None:
        if any(DATA_LOADING.search(f.file or "") for f in self.frames):
            return "data loading"
        names = " ".join(f.func for f in self.frames[:6] if not LIBRARY_FILE.search(f.file or ""))
        for label, rx in PLACES:
            if rx.search(names):
                return label
        return None

"""Make text from logs and file names safe to print on a terminal.

Log lines and file names are written by whoever wrote the job's logs: an escape sequence in one
can clear the screen, retitle the window, plant a hyperlink or write the clipboard (OSC 52). Every
piece of such text the terminal commands print goes through :func:`termsafe`, whether or not the
output is a terminal (``less -R``, ``tee`` and a later ``cat`` replay it).

>>> termsafe("ok\\tfine \\x1b]0;pwned\\x07 \\x9b2J\\rend")
'ok\\tfine \\\\x1b]0;pwned\\\\x07 \\\\x9b2J\\\\rend'
>>> termsafe("caf\\udce9.log")  # an undecodable file-name byte (surrogateescape)
'caf\\\\xe9.log'
>>> termsafe("evil\\u202etxt.exe")  # a bidi override reorders what follows
'evil\\\\u202etxt.exe'
"""

from __future__ import annotations

import re

#: C0 controls except tab, DEL, C1 controls, lone surrogates (undecodable bytes kept by
#: surrogateescape) and the bidirectional overrides/isolates that reorder the text after them.
UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u202a-\u202e"
                    "\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # the byte surrogateescape kept
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def termsafe(text: object) -> str:
    """``text`` (any object, as ``str()``) with control characters shown escaped (``\\x1b``,
    ``\\r``, ``\\n``): one line, nothing a terminal would act on. Tabs stay."""
    s = text if isinstance(text, str) else str(text)
    return UNSAFE.sub(_escape, s) if UNSAFE.search(s) else s

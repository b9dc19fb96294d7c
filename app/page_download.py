"""The "Download as a page" buttons: the shown run(s) as the folder `python -m gumiho page` writes, zipped. Only the
traces are read, so a recorded example needs no engine."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import gradio as gr

from gumiho.page import write_zip
from gumiho.trace import GenerationTrace

from .handlers import failure
from .render import is_reference
from .service import TRACE_FILES

NOTHING = "⚠ Nothing to put on a page yet: generate, race, or pick a recorded run."
READY = ("The page is ready below: unzip it and open index.html, or put the folder on a Static Space; it needs no "
         "server.")


def page_file() -> gr.File:
    """Where the zip appears, hidden until there is one."""
    return gr.File(label="This page (.zip)", visible=False, interactive=False, elem_classes="gm-extra")


def page_download(file: gr.File, message: gr.Markdown) -> Callable[[GenerationTrace | list | None], dict]:
    """A handler: the Explore tab's trace or the Race tab's traces -> the zip in `file`, a line in `message`."""

    def download(shown: GenerationTrace | list[GenerationTrace] | None) -> dict:
        runs = shown if isinstance(shown, list) else [shown] if shown is not None else []
        runs = [t for t in runs if not is_reference(t)]  # the race's transformers row has no cycles to draw
        if not runs:
            return {message: NOTHING}
        try:
            TRACE_FILES.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix="page-", dir=TRACE_FILES))  # swept with the trace downloads
            path = write_zip(runs, folder / "gumiho-page.zip")
        except Exception as exc:
            return {message: failure(exc)}
        return {file: gr.File(str(path), visible=True), message: READY}

    return download


def wire_page_download(button: gr.Button, file: gr.File, shown: gr.State, message: gr.Markdown) -> None:
    button.click(page_download(file, message), [shown], [file, message], api_visibility="private")

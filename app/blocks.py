"""gr.Blocks whose API errors explain themselves.

An API call with a missing argument, or one that a component cannot read (a string where a file belongs), fails
inside Gradio before any handler runs; Gradio then answers `success=false, error=null` and logs a traceback. Here
it answers with a `gr.Error` that says what was wrong (so gradio_client raises it with the text) and logs one line.
"""

from __future__ import annotations

import html
import logging

import gradio as gr

log = logging.getLogger(__name__)


class Blocks(gr.Blocks):
    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):  # noqa: ANN001 (Gradio's own)
        endpoint = block_fn.api_name or block_fn.name
        try:
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except gr.Error as exc:  # a component's own check (a slider's range): already a message, but with a traceback
            log.warning("refused a call to /%s: %s", endpoint, exc.message)
            exc.print_exception = False
            raise
        except Exception as exc:  # Gradio's own messages name the event and the component; the first line suffices
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("refused a call to /%s: %s", endpoint, reason)
            raise gr.Error(f"invalid input for /{endpoint}: {html.escape(reason, quote=False)}",
                           print_exception=False) from None

"""Start the Gumiho explorer: `python app.py [--share] [--host HOST] [--port PORT]`.

The page is served at once with recorded example runs; the model loads in the background (status at the top).
"""

from __future__ import annotations

import argparse
import logging


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python app.py", description=__doc__)
    parser.add_argument("--share", action="store_true", help="also serve through a public gradio.live link")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, help="port (default 7860, or the next free one)")
    parser.add_argument("--queue-size", type=int, default=32, help="requests that may wait for the engine")
    parser.add_argument("--max-prompt-tokens", type=int, default=2048, help="longer prompts are refused")
    parser.add_argument("--max-new-tokens-limit", type=int, default=512, help="the most new tokens a run may ask")
    parser.add_argument("--max-run-seconds", type=float, default=120,
                        help="a run that reaches this wall time stops after its current cycle")
    args = parser.parse_args(argv)
    if min(args.max_prompt_tokens, args.max_new_tokens_limit, args.max_run_seconds, args.queue_size) <= 0:
        parser.error("the limits and the queue size must be positive")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("app").setLevel(logging.INFO)  # the app's own progress (engine loading, refused calls)

    from app.layout import build_app, launch
    from app.service import EngineLoader
    from app.validate import Limits

    limits = Limits(args.max_prompt_tokens, args.max_new_tokens_limit, args.max_run_seconds)
    loader = EngineLoader().start()
    launch(build_app(loader, limits), host=args.host, port=args.port, share=args.share, queue_size=args.queue_size)


if __name__ == "__main__":
    main()

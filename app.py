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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from app.service import EngineLoader
    from app.ui import build_app, launch

    loader = EngineLoader().start()
    launch(build_app(loader), host=args.host, port=args.port, share=args.share, queue_size=args.queue_size)


if __name__ == "__main__":
    main()

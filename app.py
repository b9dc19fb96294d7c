"""Start the Gumiho explorer: `python app.py [--share] [--host HOST] [--port PORT]`.

The page is served at once with recorded example runs; the model loads in the background (status at the top).
"""

from __future__ import annotations

import argparse
import logging
import os
from functools import partial


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
    env = os.environ.get  # a Hugging Face Space sets these in its settings instead of flags
    parser.add_argument("--model", default=env("GUMIHO_MODEL"),
                        help="model folder or Hub id (env GUMIHO_MODEL; default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--gumiho-drafter", default=env("GUMIHO_GUMIHO_DRAFTER"),
                        help="Gumiho drafter folder or Hub id, ours or amd/Gumiho-* (env GUMIHO_GUMIHO_DRAFTER)")
    parser.add_argument("--eagle2-drafter", default=env("GUMIHO_EAGLE2_DRAFTER"),
                        help="EAGLE-2 drafter folder or Hub id, ours or yuhuili/EAGLE-* (env GUMIHO_EAGLE2_DRAFTER)")
    parser.add_argument("--device", default=env("GUMIHO_DEVICE"), help="cpu, cuda, mps (env GUMIHO_DEVICE)")
    parser.add_argument("--dtype", default=env("GUMIHO_DTYPE", "auto"),
                        help="auto (the machine profile's choice), float32, bfloat16 or float16 (env GUMIHO_DTYPE)")
    args = parser.parse_args(argv)
    if min(args.max_prompt_tokens, args.max_new_tokens_limit, args.max_run_seconds, args.queue_size) <= 0:
        parser.error("the limits and the queue size must be positive")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("app").setLevel(logging.INFO)  # the app's own progress (engine loading, refused calls)

    from app.gpu import on_space, on_zero_gpu
    from app.layout import build_app, launch
    from app.service import EngineLoader, load_default_engine
    from app.validate import Limits

    limits = Limits(args.max_prompt_tokens, args.max_new_tokens_limit, args.max_run_seconds)
    drafters = {"eagle2": args.eagle2_drafter, "gumiho": args.gumiho_drafter}
    zero_gpu = on_zero_gpu()
    loader = EngineLoader(partial(load_default_engine, model=args.model, drafters=drafters,
                                  device=args.device or ("cuda" if zero_gpu else None), dtype=args.dtype,
                                  deferred=zero_gpu, install_model=on_space()), deferred=zero_gpu)
    if zero_gpu:  # ZeroGPU captures the model's placement on cuda in the main thread, before launch (app/gpu.py)
        loader.load()
    else:  # the page is served at once, with the recorded runs, while the model loads
        loader.start()
    launch(build_app(loader, limits), host=args.host, port=args.port, share=args.share, queue_size=args.queue_size)


if __name__ == "__main__":
    main()

"""What the app costs a run, measured from outside: the bytes a browser receives for one Explore run and one race,
and a race's tokens/s in the app against the same runs through the CLI (issue #28: within 10% per method).

    .venv/bin/python scripts/measure_app.py [--app-dir DIR] [--tokens 128] [--out results.json]

The app's race and the CLI's runs alternate for `--rounds` rounds (the app idle while the CLI runs) and their
medians are compared: on a shared machine the speed drifts by a quarter over minutes, so one run of each is not a
comparison. `--app-dir` serves another checkout's app.py (e.g. a worktree of an older commit, for a before/after)
with this environment. The browser runs on the same machine, as in a classroom demo on one laptop. Pause other work first
(bash scripts/campaign_hold.sh ...): on 2 cores a background job skews every timing.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Explain in a few sentences why the sky is blue."
CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(app_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=app_dir,
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url, timeout=5):
                return process, url
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"error: the app exited; see {log}")
            time.sleep(0.5)
    raise SystemExit("error: the app did not start within 5 minutes")


def received_bytes(url: str, tokens: int) -> dict[str, int]:
    """Bytes of the server's event stream while the page runs one Explore run (Gumiho) and one race."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.enable")
        streams: dict[str, str] = {}
        counted = {"bytes": 0}
        cdp.on("Network.requestWillBeSent", lambda e: streams.__setitem__(e["requestId"], e["request"]["url"]))
        cdp.on("Network.dataReceived", lambda e: counted.__setitem__(
            "bytes", counted["bytes"] + (e["encodedDataLength"] or e["dataLength"])
            if "/queue/data" in streams.get(e["requestId"], "") else counted["bytes"]))
        page.goto(url)
        page.get_by_text("Model ready", exact=False).first.wait_for(timeout=600_000)
        out = {}
        for name, tab, button, box in (("explore", "Explore", "Generate", "Prompt"),
                                       ("race", "Race", "Race", "Race prompt")):
            page.get_by_role("tab", name=tab, exact=True).click()
            page.get_by_label(box, exact=True).fill(PROMPT)
            tokens_box = page.get_by_label("number input for Max new tokens", exact=True).filter(visible=True).first
            tokens_box.fill(str(tokens))
            tokens_box.press("Enter")
            before = counted["bytes"]
            page.get_by_role("button", name=button, exact=True).click()
            page.wait_for_function("() => [...document.querySelectorAll('.gm-message')].some("
                                   "(el) => el.offsetParent && /^(Done|Stopped)/.test(el.innerText.trim()))",
                                   timeout=600_000)
            time.sleep(2)  # the last events
            out[name] = counted["bytes"] - before
            page.evaluate("() => document.querySelectorAll('.gm-message').forEach((el) => { el.innerText = ''; })")
        browser.close()
    return out


def app_race(url: str, methods: list[str], tokens: int) -> tuple[dict[str, float], dict]:
    """tokens/s per method of one race through the app's API, and the tree it used."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    result = client.predict(PROMPT, methods, 0, tokens, 4, 12, False, api_name="/race")
    rates, tree = {}, {}
    for path in result[-1]:
        trace = json.loads(Path(path).read_text())
        rates[trace["method"]] = round(trace["tokens_per_s"], 1)
        tree = tree or (trace["settings"]["tree"] or {})
    return rates, tree


def cli_rates(methods: list[str], tokens: int) -> dict[str, float]:
    """tokens/s of each method through `python -m gumiho generate`, the prompt run twice and the second kept (the
    app warms up at load; so does this)."""
    prompts = ROOT / "artifacts" / "measure-prompt.jsonl"
    prompts.parent.mkdir(exist_ok=True)
    prompts.write_text((json.dumps({"prompt": PROMPT}) + "\n") * 2)
    rates = {}
    for method in methods:
        tree = [] if method == "ar" else ["--tree-top-k", "4", "--total-tokens", "12"]
        done = subprocess.run([sys.executable, "-m", "gumiho", "generate", "--method", method, "--prompts",
                               str(prompts), "--max-new-tokens", str(tokens), "--json", "--trace", *tree],
                              cwd=ROOT, capture_output=True, text=True, check=True)
        rates[method] = round([json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1][
            "tokens_per_s"], 1)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app-dir", type=Path, default=ROOT)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["eagle2", "gumiho"])
    parser.add_argument("--rounds", type=int, default=3,
                        help="app races and CLI runs, interleaved (this machine's speed drifts over minutes)")
    parser.add_argument("--no-cli", action="store_true", help="bytes and the app's race only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    (ROOT / "artifacts").mkdir(exist_ok=True)
    process, url = start_app(args.app_dir, ROOT / "artifacts" / "measure-app.log")
    app_rounds, cli_rounds = [], []
    try:
        result = {"app_dir": str(args.app_dir), "tokens": args.tokens, "bytes": received_bytes(url, args.tokens)}
        for _ in range(args.rounds):
            rates, result["tree"] = app_race(url, args.methods, args.tokens)
            app_rounds.append(rates)
            if not args.no_cli:  # the app sits idle meanwhile
                cli_rounds.append(cli_rates([*args.methods, "ar"], args.tokens))
    finally:
        process.terminate()
        process.wait(timeout=30)
    result["app_tokens_per_s"], result["rounds"] = medians(app_rounds), {"app": by_method(app_rounds)}
    if cli_rounds:
        result["cli_tokens_per_s"], result["rounds"]["cli"] = medians(cli_rounds), by_method(cli_rounds)
        result["app_over_cli"] = {m: round(result["app_tokens_per_s"][m] / r, 3)
                                  for m, r in result["cli_tokens_per_s"].items() if m in result["app_tokens_per_s"]}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


def by_method(rounds: list[dict[str, float]]) -> dict[str, list[float]]:
    """Each method's tokens/s in round order (the app's Benchmarks tab lists the medians, not these)."""
    return {m: [r[m] for r in rounds] for m in rounds[0]}


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {m: round(statistics.median(r[m] for r in rounds), 1) for m in rounds[0]}


if __name__ == "__main__":
    main()

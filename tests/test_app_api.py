"""The app's API through gradio_client against a launched `python app.py` (real model, shipped drafters), and what
a visitor who is not using the page can send it: over-long prompts, huge numbers, wrong types, deep uploads.

The server runs with a short time budget and a small queue, so these stay fast and the limits get exercised.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from gumiho.trace import METHODS, GenerationTrace

from .app_server import ARTIFACTS, served_app

pytestmark = pytest.mark.slow

# prompt, method, temperature, max_new_tokens, top_p, seed, top_k, depth, total_tokens, mlptopk, pruning, fta, tau_acc
GENERATE = ("Name a colour.", "gumiho", 0, 12, 1, 0, 4, 6, 24, 6, 6, False, 0.9)
MESSAGE, SUMMARY, OUTPUT, CYCLE_INFO, TREE, DOWNLOAD = 0, 1, 3, 5, 6, -1
BUDGET_S = 30  # short, yet room for the other tests' few tokens on a busy 2-core machine
QUEUE = 3
NEW_TOKENS_LIMIT = 4096
# Sampled at T = 2 the text is near-random and almost never ends its turn: 4,096 tokens outlast the budget however
# quiet the machine.
LONG = ("Tell me a long story.", "ar", 2, NEW_TOKENS_LIMIT) + GENERATE[4:]


@pytest.fixture(scope="module")
def server():
    # fp32, where greedy speculative output is exactly AR's (the browser tests run the automatic choice)
    with served_app("app-api", "--max-run-seconds", str(BUDGET_S), "--queue-size", str(QUEUE),
                    "--max-new-tokens-limit", str(NEW_TOKENS_LIMIT), "--dtype", "float32") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return Client(server, verbose=False)


def with_field(index: int, value) -> tuple:
    return GENERATE[:index] + (value,) + GENERATE[index + 1:]


def load(path: str) -> GenerationTrace:
    with open(path, encoding="utf-8") as f:
        return GenerationTrace.from_json(f.read())


def test_generate_returns_a_trace(client):
    result = client.predict(*GENERATE, api_name="/generate")
    assert result[MESSAGE] == "Done.", result[MESSAGE]  # the summary line says the rest, once
    trace = load(result[DOWNLOAD])
    assert trace.method == "gumiho" and trace.prompt == GENERATE[0]
    assert 1 <= trace.new_tokens <= 12 and trace.cycles == len(trace.steps) >= 1
    assert trace.settings.tree["total_tokens"] == 24
    cycle = trace.steps[-1]
    assert cycle.tree_size > 1 and cycle.nodes[0].source == "root"
    figure = json.loads(result[TREE]["plot"])
    assert any(t.get("name") == "bonus (target's token)" for t in figure["data"])


def test_race_returns_the_runs_in_order_then_plain_transformers_generate(client):
    result = client.predict("Name a colour.", ["gumiho", "eagle2"], 0, 10, 4, 16, False, api_name="/race")
    assert result[MESSAGE] == "Done.", result[MESSAGE]
    traces = [load(path) for path in result[-1]]
    assert [t.method for t in traces] == ["eagle2", "gumiho", "ar"]
    assert traces[0].settings.tree["total_tokens"] == traces[1].settings.tree["total_tokens"] == 16
    assert traces[2].tau == 1.0
    # Greedy without FTA: every method writes exactly the target's own tokens.
    assert traces[0].token_ids == traces[1].token_ids == traces[2].token_ids
    table = result[2]
    assert [row[0] for row in table["data"]] == ["EAGLE-2", "Gumiho", "AR", "transformers generate (fp32)"]
    assert table["data"][3][2] == table["data"][2][2] == 9  # cycles: the reference generated the same 10 tokens
    columns = table["headers"]
    reference, ar = (dict(zip(columns, row)) for row in (table["data"][3], table["data"][2]))
    assert reference["vs transformers"] == "1.00×"
    assert reference["decoding speed-up"] == "–" and ar["decoding speed-up"] == "1.00×"  # no cycles: no decoding rate
    assert "identical to AR" in result[6]


@pytest.mark.parametrize("prompt, expected", [
    ("", "the prompt is empty"), ("   ", "the prompt is empty"),
    ("word " * 9000, "the prompt is 45,000 characters; this app accepts prompts of up to 2,048 tokens"),
    ("word " * 3000, "tokens; this app accepts at most 2,048"),  # short enough in characters: counted in tokens
])
def test_bad_prompt_returns_the_message(client, prompt, expected):
    result = client.predict(prompt, *GENERATE[1:], api_name="/generate")
    assert expected in result[MESSAGE]


@pytest.mark.parametrize("index, value, expected", [
    (5, 2**80, "seed must be between 0 and 2^63-1, got 1208925819614629174706176"),
    (5, -1, "seed must be between 0 and 2^63-1"),
    (3, 9999, f"max new tokens must be between 1 and {NEW_TOKENS_LIMIT}, got 9999"),
    (3, 0, f"max new tokens must be between 1 and {NEW_TOKENS_LIMIT}, got 0"),
    (3, -5, f"max new tokens must be between 1 and {NEW_TOKENS_LIMIT}, got -5"),
    (2, 2.5, "temperature must be between 0 and 2, got 2.5"),
    (1, "<script>alert(1)</script>", f"method must be one of {', '.join(METHODS)}, got '&lt;script&gt;"),
])
def test_out_of_range_values_get_a_message_naming_the_field(client, index, value, expected):
    result = client.predict(*with_field(index, value), api_name="/generate")
    assert result[MESSAGE] == f"⚠ {expected}" or result[MESSAGE].startswith(f"⚠ {expected}"), result[MESSAGE]
    assert "<script>" not in result[MESSAGE]


@pytest.mark.parametrize("index, value, expected", [
    (5, "abc", "seed must be a number (0 to 2^63-1), got 'abc'"),  # quotes are safe in text: kept
    (0, 123, "prompt must be a string, got 123"),
    (11, "yes", "fta must be true or false"),
])
def test_a_wrong_type_raises_the_reason_for_the_caller(client, index, value, expected):
    with pytest.raises(AppError, match=re.escape(expected)):
        client.predict(*with_field(index, value), api_name="/generate")


def test_a_missing_argument_is_explained_in_one_log_line(server):
    """A raw call (gradio_client fills in defaults) with two of the thirteen values."""
    def post(path: str, body: dict) -> dict:
        request = urllib.request.Request(server + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    event = post("gradio_api/call/generate", {"data": ["hi", "gumiho"]})["event_id"]
    with urllib.request.urlopen(f"{server}gradio_api/call/generate/{event}", timeout=30) as response:
        stream = response.read().decode()
    assert "event: error" in stream and "didn't receive enough input values (needed: 13, got: 2)" in stream
    log = (ARTIFACTS / "app-api.log").read_text()
    assert "refused a call to /generate: An event handler (generate) didn't receive enough" in log
    assert "Traceback" not in log


def test_bad_settings_return_the_message_and_the_app_keeps_working(client):
    too_big = GENERATE[:6] + (1, 6, 64, 1, 1, False, 0.9)  # 64 tokens from a 7-node pool
    result = client.predict(*too_big, api_name="/generate")
    assert "exceeds" in result[MESSAGE]
    result = client.predict("Say hi.", "ar", 0, 4, 1, 0, 4, 6, 24, 6, 6, False, 0.9, api_name="/generate")
    assert result[MESSAGE].startswith("Done") and load(result[DOWNLOAD]).method == "ar"


@pytest.mark.parametrize("methods, expected", [
    ([], "⚠ pick at least one method to race against AR"),
    (["gumiho", "ar"], "⚠ methods must be among"),
])
def test_race_methods_are_checked(client, methods, expected):
    """The methods a race compares are checked before anything runs."""
    result = client.predict("Name a colour.", methods, 0, 10, 4, 16, False, api_name="/race")
    assert result[MESSAGE].startswith(expected), result[MESSAGE]


def test_mjsd_run_is_marked_approximate_and_shows_its_joint_checks(client):
    result = client.predict("Name a colour.", "mjsd", 0, 12, 1, 0, 4, 3, 4, 6, 6, False, 0.5, api_name="/generate")
    trace = load(result[DOWNLOAD])
    assert trace.method == "mjsd" and trace.settings.tree["tau_acc"] == 0.5 and trace.settings.tree["depth"] == 3
    assert trace.settings.tree["top_k"] == 4 and trace.settings.approximate
    assert all(len(c.joint) == 3 for c in trace.steps if c.tree_size == 4)
    assert "Approximate output" in result[SUMMARY]
    assert "MJSD's joint check" in result[CYCLE_INFO]


def test_replay_validates_uploads(client, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 1, "method": "gumiho", "steps": "oops"}')
    result = client.predict(handle_file(str(bad)), api_name="/replay")
    assert result[MESSAGE].startswith("⚠") and "trace" in result[MESSAGE]
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = client.predict(handle_file(str(deep)), api_name="/replay")
    assert result[MESSAGE] == "⚠ the file nests more than 16 levels deep; it is not a trace"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"schema": 1, "method": "<script>alert(1)</script>", "model": "m", "prompt": "p",
                                  "prompt_tokens": 1, "settings": {}}))
    result = client.predict(handle_file(str(script)), api_name="/replay")
    assert result[MESSAGE] == "⚠ unknown method '&lt;script&gt;alert(1)&lt;/script&gt;'"
    good = tmp_path / "good.json"
    good.write_text(load(client.predict(*GENERATE, api_name="/generate")[DOWNLOAD]).to_json())
    result = client.predict(handle_file(str(good)), api_name="/replay")
    assert result[MESSAGE].startswith("Replaying")


def test_stop_cancels_a_running_generation(client):
    job = client.submit("Tell me a long story about a fox.", "eagle2", 0, 400, 1, 0, 4, 5, 24, 6, 6, False,
                        api_name="/generate")
    for _ in range(400):
        if client.predict(api_name="/stop").startswith("Stopping"):
            break
        time.sleep(0.5)
    else:
        pytest.fail("the generation never started")
    result = job.result(timeout=300)
    assert result[MESSAGE] == "Stopped."
    trace = load(result[DOWNLOAD])
    assert trace.finish_reason == "stopped" and trace.new_tokens < 400


def test_the_time_budget_stops_a_long_run_and_keeps_its_text(client):
    result = client.predict(*LONG, api_name="/generate")
    assert result[MESSAGE] == f"Stopped: time budget ({BUDGET_S} s).", result[MESSAGE]
    trace = load(result[DOWNLOAD])
    assert trace.finish_reason == "stopped" and 1 < trace.new_tokens < NEW_TOKENS_LIMIT and trace.text


def test_the_end_of_turn_token_is_hidden_in_the_text_but_kept_in_the_trace(client):
    result = client.predict("Say hi.", "ar", 0, 64, 1, 0, 4, 6, 24, 6, 6, False, api_name="/generate")
    trace = load(result[DOWNLOAD])
    assert trace.finish_reason == "eos", "the model was expected to end its turn within 64 tokens"
    assert trace.steps[-1].bonus_text == "<|im_end|>"
    assert "im_end" not in result[OUTPUT]


def test_several_clients_are_served_in_turn_and_a_cancel_or_a_full_queue_harms_no_one(server):
    """Six visitors at once against one engine worker and a queue of three: each is served or told that the queue
    is full, the one who cancels is not served, and the app answers afterwards."""
    clients = [Client(server, verbose=False) for _ in range(6)]
    jobs = [c.submit("Name a fruit.", "gumiho", 0, 6, 1, i, 4, 6, 12, 6, 6, False, api_name="/generate")
            for i, c in enumerate(clients)]
    time.sleep(1)
    jobs[-1].cancel()

    def outcome(job) -> str:
        try:
            return job.result(timeout=300)[MESSAGE]
        except Exception as exc:  # a full queue, or the cancelled job
            return f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(len(jobs)) as pool:
        outcomes = list(pool.map(outcome, jobs[:-1]))
    served = [o for o in outcomes if o == "Done."]
    refused = [o for o in outcomes if "Queue is full" in o]
    assert served and len(served) + len(refused) == len(outcomes), outcomes
    assert clients[0].predict(*GENERATE, api_name="/generate")[MESSAGE] == "Done."

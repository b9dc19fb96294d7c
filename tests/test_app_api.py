"""The app's API through gradio_client against a launched `python app.py` (real model, shipped drafters)."""

from __future__ import annotations

import json
import time

import pytest
from gradio_client import Client, handle_file

from gumiho.trace import GenerationTrace

from .app_server import served_app

pytestmark = pytest.mark.slow

# prompt, method, temperature, max_new_tokens, top_p, seed, top_k, depth, total_tokens, mlptopk, pruning, fta
GENERATE = ("Name a colour.", "gumiho", 0, 12, 1, 0, 4, 6, 24, 6, 6, False)
MESSAGE, DOWNLOAD = 0, -1


@pytest.fixture(scope="module")
def client():
    with served_app("app-api") as url:
        yield Client(url, verbose=False)


def load(path: str) -> GenerationTrace:
    with open(path, encoding="utf-8") as f:
        return GenerationTrace.from_json(f.read())


def test_generate_returns_a_trace(client):
    result = client.predict(*GENERATE, api_name="/generate")
    assert result[MESSAGE].startswith("Done"), result[MESSAGE]
    trace = load(result[DOWNLOAD])
    assert trace.method == "gumiho" and trace.prompt == GENERATE[0]
    assert 1 <= trace.new_tokens <= 12 and trace.cycles == len(trace.steps) >= 1
    assert trace.settings.tree["total_tokens"] == 24
    cycle = trace.steps[-1]
    assert cycle.tree_size > 1 and cycle.nodes[0].source == "root"
    figure = json.loads(result[6]["plot"])
    assert any(t.get("name") == "bonus (target's token)" for t in figure["data"])


def test_race_returns_three_runs_in_order(client):
    result = client.predict("Name a colour.", 0, 10, 4, 16, False, api_name="/race")
    assert result[MESSAGE] == "Done.", result[MESSAGE]
    traces = [load(path) for path in result[-1]]
    assert [t.method for t in traces] == ["eagle2", "gumiho", "ar"]
    assert traces[0].settings.tree["total_tokens"] == traces[1].settings.tree["total_tokens"] == 16
    assert traces[2].tau == 1.0
    # Greedy without FTA: every method writes exactly the target's own tokens.
    assert traces[0].token_ids == traces[1].token_ids == traces[2].token_ids
    table = result[2]
    assert [row[0] for row in table["data"]] == ["EAGLE-2", "Gumiho", "AR"]
    assert "identical to AR" in result[6]


@pytest.mark.parametrize("prompt, expected", [("", "the prompt is empty"), ("   ", "the prompt is empty"),
                                              ("word " * 9000, "the model's context is")])
def test_bad_prompt_returns_the_message(client, prompt, expected):
    result = client.predict(prompt, *GENERATE[1:], api_name="/generate")
    assert expected in result[MESSAGE]


def test_bad_settings_return_the_message_and_the_app_keeps_working(client):
    too_big = GENERATE[:6] + (1, 6, 64, 1, 1, False)  # 64 tokens from a 7-node pool
    result = client.predict(*too_big, api_name="/generate")
    assert "exceeds" in result[MESSAGE]
    result = client.predict("Say hi.", "ar", 0, 4, 1, 0, 4, 6, 24, 6, 6, False, api_name="/generate")
    assert result[MESSAGE].startswith("Done") and load(result[DOWNLOAD]).method == "ar"


def test_replay_validates_uploads(client, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 1, "method": "gumiho", "steps": "oops"}')
    result = client.predict(handle_file(str(bad)), api_name="/replay")
    assert result[MESSAGE].startswith("⚠") and "trace" in result[MESSAGE]
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

"""`--engine URL` is probed before the chat opens (chat/remote_probe.py): GET /models, and /v1
added when the URL lacks it; one line says what was found; a URL where nothing answers is
refused then, not at the first message (it used to fail only after the first message)."""

from __future__ import annotations

import socket

import httpx
import pytest

from ds4tui.chat.remote_probe import found, probe_endpoint
from ds4tui.chat.remote_stream import RemoteError

MODELS = {"object": "list", "data": [{"id": "qwen3-8b", "object": "model", "max_model_len": 32768},
                                      {"id": "smollm2", "object": "model"}]}


def server(routes: dict[str, tuple[int, object]]) -> httpx.MockTransport:
    """A fake server: path -> (status, JSON body or text); anything else is a 404 page."""
    def handle(request: httpx.Request) -> httpx.Response:
        status, body = routes.get(request.url.path, (404, "<html>Not Found</html>"))
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


def test_a_url_without_v1_is_tried_with_it_and_the_line_says_so():
    probe = probe_endpoint("http://gpu-box:8008", transport=server({"/v1/models": (200, MODELS)}))
    assert probe.endpoint == "http://gpu-box:8008/v1" and [m["id"] for m in probe.models] == ["qwen3-8b", "smollm2"]
    line = found(probe, None)
    assert line == ("http://gpu-box:8008/v1 · 2 models (qwen3-8b, smollm2) · chatting with qwen3-8b, context 32,768"
                    " tokens (--engine http://gpu-box:8008 has no /v1: using http://gpu-box:8008/v1)")
    assert "not listed" in found(probe, "llama-70b")


def test_a_url_with_v1_that_lists_models_is_used_as_given():
    probe = probe_endpoint("http://gpu-box:8008/v1/", transport=server({"/v1/models": (200, MODELS)}))
    assert probe.endpoint == "http://gpu-box:8008/v1" and "has no /v1" not in found(probe, "smollm2")
    assert "chatting with smollm2" in found(probe, "smollm2") and "context" not in found(probe, "smollm2")


def test_nothing_listening_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RemoteError) as caught:
        probe_endpoint(f"http://127.0.0.1:{port}")  # closed port: refused at once, /v1 not tried
    text = str(caught.value)
    assert text.startswith(f"--engine http://127.0.0.1:{port}: no OpenAI-compatible server found: cannot connect")
    assert "\n" not in text and "/v1" not in text


def test_a_web_page_is_no_server_unless_a_model_is_named():
    page = server({"/models": (200, "<html>my blog</html>"), "/v1/models": (200, "<html>my blog</html>")})
    with pytest.raises(RemoteError) as caught:
        probe_endpoint("http://example.test", transport=page)
    assert "not a model list" in str(caught.value) and "--remote-model NAME" in str(caught.value)
    probe = probe_endpoint("http://example.test", model="mine", transport=page)
    assert probe.models == [] and "no model list; chatting with mine" in found(probe, "mine")


def test_a_refused_key_is_refused_now():
    denied = server({"/v1/models": (401, {"error": {"message": "invalid api key"}})})
    with pytest.raises(RemoteError) as caught:
        probe_endpoint("http://gpu-box:8008/v1", api_key="wrong", transport=denied)
    assert "refused the API key (HTTP 401): invalid api key" in str(caught.value)


def test_the_controller_knows_the_model_and_context_before_the_first_message(tmp_path):
    from ds4tui.chat.remote import RemoteChatController
    from ds4tui.config import Config

    probe = probe_endpoint("http://gpu-box:8008", transport=server({"/v1/models": (200, MODELS)}))
    ctl = RemoteChatController(probe.endpoint, Config(data_dir=str(tmp_path)), models=probe.models)
    assert ctl.model_name == "qwen3-8b @ gpu-box" and ctl.ctx_size() == 32768

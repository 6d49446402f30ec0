"""`--engine URL` checked before the chat opens: does an OpenAI-compatible server answer there?

Owns `probe_endpoint`: GET URL/models, and when the URL does not end in /v1 and that finds
no model list, URL/v1/models too (`--engine http://host:8008` means the server's API root
more often than not); the endpoint that answered, the models it lists, and one line saying
what was found (`found`), which the command line prints before the UI takes the terminal. A
URL where nothing answers, or that refuses the key, is a RemoteError: the chat does not
open (it used to open and fail at the first message). A server that answers but lists no
models still serves a `--remote-model` named on the command line.
Leaves the chat itself to `RemoteChatController` (chat/remote.py), which takes the list.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from ds4tui.chat.remote_server import CONNECT_S, context_of, describe_status, describe_transport
from ds4tui.chat.remote_stream import RemoteError


@dataclass(frozen=True)
class Probe:
    endpoint: str  # the /v1 base URL that answered
    models: list[dict]  # /models' entries (empty: it listed none, or has no such route)
    given: str  # the URL as given


def _entries(response: httpx.Response) -> list[dict] | None:
    """The model list of a /models answer; None when it is not one (an HTML page, an error)."""
    if response.status_code != 200:
        return None
    try:
        data = response.json()["data"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(data, list):
        return None
    return [m for m in data if isinstance(m, dict) and "id" in m]


def probe_endpoint(url: str, *, api_key: str | None = None, model: str | None = None,
                   transport: httpx.BaseTransport | None = None) -> Probe:
    """The endpoint of `url` that lists models (or, with `model` named, that answers at all);
    RemoteError naming what happened at each URL tried otherwise."""
    base = url.rstrip("/")
    candidates = [base] if base.endswith("/v1") else [base, base + "/v1"]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    problems: list[str] = []
    answered: str | None = None
    with httpx.Client(headers=headers, transport=transport, timeout=httpx.Timeout(CONNECT_S)) as http:
        for endpoint in candidates:
            try:
                response = http.get(f"{endpoint}/models")
            except httpx.HTTPError as exc:
                problems.append(describe_transport(exc, endpoint, 0))
                if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                    break  # the same host: adding /v1 cannot help
                continue
            if response.status_code in (401, 403):
                raise RemoteError(f"--engine {url}: {describe_status(response, endpoint)}")
            entries = _entries(response)
            if entries:
                return Probe(endpoint, entries, url)
            answered = answered or endpoint
            problems.append(f"{endpoint}/models: " + ("lists no model" if entries == [] else
                                                      describe_status(response, endpoint)
                                                      if response.status_code != 200 else "not a model list"))
    if model is not None and answered is not None:
        return Probe(answered, [], url)  # it answers; the model is named: the chat will tell
    hint = "" if answered is None else " (name one with --remote-model NAME if the server serves one)"
    raise RemoteError(f"--engine {url}: no OpenAI-compatible server found: {'; '.join(problems)}{hint}")


def found(probe: Probe, model: str | None) -> str:
    """One line: where the server is, what it lists, which model the chat uses and its context."""
    ids = [str(m["id"]) for m in probe.models]
    use = model or (ids[0] if ids else "?")
    parts = [probe.endpoint]
    if ids:
        listed = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        parts.append(f"{len(ids)} model{'s' if len(ids) != 1 else ''} ({listed})")
        mine = next((m for m in probe.models if str(m["id"]) == use), None)
        if mine is None:
            parts.append(f"chatting with {use} (not listed: the server may still serve it)")
        else:
            context = context_of(mine)
            parts.append(f"chatting with {use}" + (f", context {context:,} tokens" if context else ""))
    else:
        parts.append(f"no model list; chatting with {use}")
    line = " · ".join(parts)
    if probe.endpoint.rstrip("/") != probe.given.rstrip("/"):
        line += f" (--engine {probe.given} has no /v1: using {probe.endpoint})"
    return line

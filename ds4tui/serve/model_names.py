"""The `model` names a request to `ds4tui serve` may give, and the 404 for any other.

Owns `ServedNames`: the one model a server runs answers to its id (what responses and
/v1/models say), to the spec the operator started it with and that file's name, and to
each `--alias`; `--alias '*'` takes any name (llama-server's way). A request without a
`model` field means the one model served. Any other name is refused as OpenAI refuses it
(404, code `model_not_found`), naming the model that runs here: a client set up for
another model finds out on its first request instead of getting answers from one it
did not ask for (docs/serve.md, "Model names").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from ds4tui.serve.protocol import RequestError

ANY = "*"  # --alias '*': any name is this model


@dataclass(frozen=True)
class ServedNames:
    id: str  # the served model's name: responses and /v1/models give it
    aliases: tuple[str, ...] = ()  # --alias names, listed by /v1/models after the id
    spec: str | None = None  # what --model said (a registered name or a path)

    @property
    def accepted(self) -> tuple[str, ...]:
        """Every name a request may give, the id first (ANY when any name goes)."""
        names = [self.id]
        if self.spec:
            path = PurePath(self.spec)
            names += [self.spec, path.name, path.stem]
        names += self.aliases
        return tuple(dict.fromkeys(n for n in names if n))

    @property
    def listed(self) -> tuple[str, ...]:
        """The ids /v1/models lists: the model's, then the aliases the operator gave."""
        return tuple(dict.fromkeys(n for n in (self.id, *self.aliases) if n != ANY))

    def describe(self) -> str:
        """For the start-up line: which names requests may give."""
        if ANY in self.accepted:
            return f"anything (--alias '*'; answered as '{self.id}')"
        return ", ".join(f"'{n}'" for n in self.accepted) + " (or leave it out; --alias adds names)"

    def check(self, body: object) -> None:
        """RequestError (404 model_not_found) when the body names a model not served here."""
        if not isinstance(body, dict) or body.get("model") is None:
            return  # not an object (the request check says so) or no name: the one served
        name = body["model"]
        if not isinstance(name, str):
            raise RequestError("model must be a string", param="model")
        accepted = self.accepted
        if ANY in accepted or name.casefold() in {n.casefold() for n in accepted}:
            return
        # A path is accepted but not told: the server's directories are not the client's business.
        others = ", ".join(f"'{n}'" for n in accepted[1:] if "/" not in n and "\\" not in n)
        raise RequestError(
            f"The model '{name[:200]}' is not served here: this server runs '{self.id}'"
            f"{f' (also accepted: {others})' if others else ''}. Ask for it by that name, or start the"
            f" server with --alias '{name[:200]}' to accept this one too.",
            param="model", status=404, code="model_not_found")

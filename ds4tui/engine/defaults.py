"""The engine's defaults, defined once: the model a chat loads when none is named and the
context a session gets when none is asked for.

Imports nothing, so the command line's `--help`, the config and the Makefile's `models pull`
read them without loading torch.
"""

# The registered name (engine/registry.py) the config, `--model` and a bare `models pull` default to.
DEFAULT_MODEL = "smollm2-135m-instruct"

# A session's context when the caller names none (or the model's own, if smaller), for every
# family: SmolLM2's 8192 would pin 377 MB of fp32 KV (189 MB f16); 4096 (189 MB fp32, 94 MB
# f16) is plenty for a chat on a CPU, where filling it takes tens of seconds.
DEFAULT_CTX = 4096

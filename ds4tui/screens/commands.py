"""Command palette entries (ctrl+p) for the chat: keys, new chat, rename, cache browser, settings, quit,
and one "System prompt: NAME" per preset of the config's `[system_prompts]`.

The app drops Textual's own "Quit" (app.py), so the palette lists Quit once.

Owns: the names and help lines; each entry runs the chat screen's action of
the same name, so the palette, the key bindings and the footer stay in step.
"""

from __future__ import annotations

from functools import partial

from ds4tui.format.display import one_line

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (palette name, help line, chat screen action)
CHAT_COMMANDS = (
    ("Keys of the chat", "Every key of the chat on one screen (f1)", "keys_help"),
    ("New chat", "Start an empty conversation (ctrl+n)", "new_chat"),
    ("Rename chat", "Give the active conversation a new title (f2)", "rename"),
    ("Cache browser", "Browse, pin, delete or resume the .kv files on disk (f4)", "cache_browser"),
    ("Settings", "Temperature, top-p, max tokens, system prompt of this chat (f3)", "settings"),
    ("System prompt…", "Edit this chat's system prompt, pick a preset or save it as one (f3)", "settings"),
    ("Regenerate reply", "Sample the last reply again; the old one stays (ctrl+r, then ←/→ on it)", "regenerate"),
    ("Show/hide the chat list", "The sidebar of open and saved chats (ctrl+b)", "toggle_sidebar"),
    ("Find a chat", "Search titles and messages of every stored chat (ctrl+f)", "find_chat"),
    ("Fork chat", "A new chat holding this one's state: no prefill (f on a selected message forks there)", "fork_chat"),
    ("Delete chat", "Delete the active chat: its history and its .kv files (asks first)", "delete_chat"),
    ("Archive chat", "Hide the active chat from the list; `ds4tui chats ls --archived` shows it", "archive_chat"),
    ("Export chat", "Write this chat as NAME.md and NAME.json in the export folder (config export_dir)", "export_chat"),
    ("Switch model", "Load another model; the chat on screen reopens on it from its history", "switch_model"),
    ("Model info", "Architecture, weight types, attention layout and chat format of the model", "model_info"),
    ("Quit", "Save live sessions and exit (ctrl+q)", "quit"),
)


class ChatCommands(Provider):
    """Offers the chat actions while the chat screen is the active one."""

    def _commands(self):
        from ds4tui.screens.chat import ChatScreen

        screen = self.screen
        if not isinstance(screen, ChatScreen):
            return
        for name, help_text, action in CHAT_COMMANDS:
            target = self.app if action == "quit" else screen
            yield name, help_text, partial(target.run_action, action)
        for preset, text in sorted(screen.config.system_prompts.items(), key=lambda p: p[0].casefold()):
            yield (f"System prompt: {one_line(preset, 40)}", f"Use it in this chat: {one_line(text, 70)}",
                   partial(screen.use_system_prompt, preset))

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
